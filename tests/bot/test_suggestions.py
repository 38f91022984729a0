"""Autocomplete for /act's motion and background: what the model was trained on, and what this server plays most."""

from __future__ import annotations

from pathlib import Path

from game.instruction import from_fields
from tests.bot.conftest import running_bot
from tests.bot.helpers import WriteLock, seed_turn
from tests.discord_double import DiscordDouble, Guild, member

ALICE = member("alice")


def names(choices: list[dict]) -> list[str]:
    return [choice["value"] for choice in choices]


async def test_motions_suggested_are_the_ones_the_model_was_trained_on(double, bot_settings):
    async with running_bot(double, bot_settings):
        offered = names(await (await double.autocomplete("act", "motion", "fly", user=ALICE)).choices())
        places = names(await (await double.autocomplete("act", "background", "night", user=ALICE)).choices())
    assert "gently fly on broomstick" in offered  # the toy world's action, at one of its adverbs
    assert all("fly" in motion for motion in offered)
    assert "night bedroom" in places and all(place.startswith("night") for place in places)
    assert all(from_fields("Qiqi", motion, place) for motion in offered for place in places)  # each one plays


async def test_a_servers_most_played_motions_and_backgrounds_come_first(bot_settings):
    home, elsewhere = Guild(), Guild()
    played = {
        home.id: ["happily juggle apples; Background: moon base"] * 2 + ["gently dance; Background: night town"],
        elsewhere.id: ["lazily bake bread; Background: bakery"] * 3,
    }
    async with DiscordDouble(guilds=[home, elsewhere]) as double, running_bot(double, bot_settings):
        for guild, lines in played.items():
            for user, line in enumerate(lines, 100):
                line = f"Character: Qiqi; Motion: {line}."
                await seed_turn(bot_settings, guild, 1, user, line=line, done=True)
        motions = names(await (await double.autocomplete("act", "motion", "", user=ALICE, guild_id=home.id)).choices())
        places = names(
            await (await double.autocomplete("story act", "background", "", user=ALICE, guild_id=home.id)).choices()
        )
    assert motions[:2] == ["happily juggle apples", "gently dance"]
    assert places[:2] == ["moon base", "night town"]
    assert "lazily bake bread" not in motions  # another server's play stays there
    assert "gently fly on broomstick" in motions  # and the model's own follow


async def test_suggestions_answer_in_time_while_another_process_holds_the_write_lock(bot_settings):
    async with DiscordDouble(strict=True) as double, running_bot(double, bot_settings):
        with WriteLock(Path(bot_settings.database_url.removeprefix("sqlite+aiosqlite:///"))):
            handle = await double.autocomplete("act", "motion", "wave", user=ALICE)
            offered = names(await handle.choices(timeout=10))
    assert not handle.late  # the double refuses a late answer, as Discord does
    assert "gently wave to a friend" in offered
