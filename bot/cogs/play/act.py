"""/act: take a turn, as fields or as one AnimeGamer instruction line."""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.cogs.play.character import character_choices
from bot.turn_options import Background, CharacterName, Line, Motion, turn_options
from bot.turns import TurnInput, submit_turn

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot


class ActCommands:
    bot: AnimeGamerBot

    @turn_options
    @app_commands.command(name="act", description="Take a turn: what your character does, and where")
    @app_commands.guild_only()
    async def act(
        self,
        interaction: discord.Interaction,
        motion: Motion | None = None,
        background: Background | None = None,
        time: str | None = None,
        character: CharacterName | None = None,
        instruction: Line | None = None,
    ) -> None:
        typed = TurnInput(instruction=instruction, motion=motion, background=background, character=character, time=time)
        await submit_turn(self.bot, interaction, typed)

    @act.autocomplete("character")
    async def act_character(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
        return await character_choices(self.bot, current)
