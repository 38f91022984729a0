"""A second click before what cannot be undone (/reset, /mydata delete): the asker's alone, for a minute."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import discord


class Confirm(discord.ui.View):
    """Two buttons; ``confirmed`` is True, False, or None when the minute ran out. Each click replaces the question
    with what happens now."""

    def __init__(self, user_id: int, *, yes: tuple[str, str], no: tuple[str, str]) -> None:
        """``yes`` and ``no``: each button's label and the text that replaces the question when it is clicked."""
        super().__init__(timeout=60)
        self.user_id = user_id
        self.confirmed: bool | None = None
        for (label, then), style, value in (
            (yes, discord.ButtonStyle.danger, True),
            (no, discord.ButtonStyle.secondary, False),
        ):
            button: discord.ui.Button[Confirm] = discord.ui.Button(label=label, style=style)
            button.callback = self._answer(then, value)
            self.add_item(button)

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return interaction.user.id == self.user_id

    def _answer(self, then: str, value: bool) -> Callable[[discord.Interaction], Awaitable[None]]:
        async def clicked(interaction: discord.Interaction) -> None:
            self.confirmed = value
            await interaction.response.edit_message(content=then, view=None)
            self.stop()

        return clicked
