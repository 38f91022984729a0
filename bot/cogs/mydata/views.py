"""The mydata cog's own view: the confirmation /mydata delete asks for."""

from __future__ import annotations

import discord


class ConfirmDelete(discord.ui.View):
    """Deleting a player's data in every server cannot be undone, so it takes a second click, theirs alone."""

    def __init__(self, user_id: int) -> None:
        super().__init__(timeout=60)
        self.user_id = user_id
        self.confirmed: bool | None = None

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return interaction.user.id == self.user_id

    @discord.ui.button(label="Delete everything", style=discord.ButtonStyle.danger)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.confirmed = True
        await interaction.response.edit_message(content="Deleting…", view=None)
        self.stop()

    @discord.ui.button(label="Keep it", style=discord.ButtonStyle.secondary)
    async def keep(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.confirmed = False
        await interaction.response.edit_message(content="Nothing was deleted.", view=None)
        self.stop()
