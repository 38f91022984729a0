"""The options of every command that makes a turn (/act, /story act, /story propose), declared once.

A command lists the options it takes in its signature with these types, and ``@turn_options`` gives them their
descriptions and the motion, background and time suggestions, so the three commands read and behave alike.
"""

from __future__ import annotations

import discord
from discord import app_commands

from bot.suggestions import background_choices, motion_choices
from game.instruction import MAX_FIELD_CHARS, MAX_LINE_CHARS, TIMES

Motion = app_commands.Range[str, 1, MAX_FIELD_CHARS]
Background = app_commands.Range[str, 1, MAX_FIELD_CHARS]
CharacterName = app_commands.Range[str, 1, MAX_FIELD_CHARS]
Line = app_commands.Range[str, 1, MAX_LINE_CHARS]

DESCRIPTIONS = {
    "motion": "what your character does, e.g. 'gently fly on broomstick'",
    "background": "where, e.g. 'sky' or 'night street'",
    "time": "time of day (optional)",
    "character": "who acts (optional: your character)",
    "instruction": "or one whole line: Character: X; Motion: Y; Background: Z.",
}


async def time_choices(interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
    return [app_commands.Choice(name=t, value=t) for t in sorted(TIMES) if current.casefold() in t][:25]


def turn_options(command: app_commands.Command) -> app_commands.Command:
    """Describe the turn options ``command`` takes and suggest their values (apply above ``@app_commands.command``)."""
    names = {parameter.name for parameter in command.parameters}
    app_commands.describe(**{name: text for name, text in DESCRIPTIONS.items() if name in names})(command)
    for name, choices in (("motion", motion_choices), ("background", background_choices), ("time", time_choices)):
        if name in names:
            command.autocomplete(name)(choices)
    return command
