"""The commands that make a turn take their shared options alike: declared once (bot/turn_options.py)."""

from __future__ import annotations

import pytest

from bot.cogs.play import Play
from bot.cogs.story import Stories
from bot.turn_options import DESCRIPTIONS

SHARED = ("motion", "background", "time", "instruction")
COMMANDS = {"/act": Play.act, "/story act": Stories.act, "/story propose": Stories.propose}


def _options(command) -> dict[str, dict]:
    """Each option as Discord is told it: what a player sees and may type."""
    return {
        p.name: {
            "type": p.type,
            "description": p.description,
            "required": p.required,
            "autocomplete": p.autocomplete,
            "max_length": p.max_value,
            "min_length": p.min_value,
        }
        for p in command.parameters
    }


@pytest.mark.parametrize("name", SHARED)
def test_act_story_act_and_story_propose_declare_each_shared_option_identically(name: str) -> None:
    declared = [_options(command)[name] for command in COMMANDS.values()]
    assert all(option == declared[0] for option in declared), declared
    assert declared[0]["description"] == DESCRIPTIONS[name] and not declared[0]["required"]


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_motion_background_and_time_are_suggested_in_every_turn_command(command) -> None:
    options = _options(command)
    assert [options[name]["autocomplete"] for name in ("motion", "background", "time")] == [True, True, True]
    assert options["motion"]["max_length"] == options["background"]["max_length"] > 0
