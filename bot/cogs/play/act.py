"""/act: take a turn, as fields or as one AnimeGamer instruction line."""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.cogs.play.character import character_choices
from bot.suggestions import background_choices, motion_choices
from bot.turns import TurnInput, submit_turn
from game.instruction import MAX_FIELD_CHARS, MAX_LINE_CHARS, TIMES

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot


class ActCommands:
    bot: AnimeGamerBot

    @app_commands.command(name="act", description="Take a turn: what your character does, and where")
    @app_commands.describe(
        motion="what your character does, e.g. 'gently fly on broomstick'",
        background="where, e.g. 'sky' or 'night street'",
        time="time of day (optional)",
        character="who acts (optional: your character)",
        instruction="or one whole line: Character: X; Motion: Y; Background: Z.",
    )
    @app_commands.guild_only()
    async def act(
        self,
        interaction: discord.Interaction,
        motion: app_commands.Range[str, 1, MAX_FIELD_CHARS] | None = None,
        background: app_commands.Range[str, 1, MAX_FIELD_CHARS] | None = None,
        time: str | None = None,
        character: app_commands.Range[str, 1, MAX_FIELD_CHARS] | None = None,
        instruction: app_commands.Range[str, 1, MAX_LINE_CHARS] | None = None,
    ) -> None:
        typed = TurnInput(instruction=instruction, motion=motion, background=background, character=character, time=time)
        await submit_turn(self.bot, interaction, typed)

    act.autocomplete("motion")(motion_choices)
    act.autocomplete("background")(background_choices)

    @act.autocomplete("character")
    async def act_character(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
        return await character_choices(self.bot, current)

    @act.autocomplete("time")
    async def act_time(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
        return [app_commands.Choice(name=t, value=t) for t in sorted(TIMES) if current.casefold() in t][:25]
