"""The play cog's own view: the confirmation /reset asks for."""

from __future__ import annotations

import discord


class ConfirmReset(discord.ui.View):
    """Starting over loses a character's history, so it takes a second click."""

    def __init__(self, user_id: int) -> None:
        super().__init__(timeout=60)
        self.user_id = user_id
        self.confirmed: bool | None = None

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return interaction.user.id == self.user_id

    @discord.ui.button(label="Start over", style=discord.ButtonStyle.danger)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.confirmed = True
        await interaction.response.edit_message(content="Starting over…", view=None)
        self.stop()

    @discord.ui.button(label="Keep playing", style=discord.ButtonStyle.secondary)
    async def keep(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.confirmed = False
        await interaction.response.edit_message(content="Nothing changed.", view=None)
        self.stop()
