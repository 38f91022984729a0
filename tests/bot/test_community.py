"""/profile and /board: pictures that decode and show the right numbers, beside the same numbers as text."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from bot.cogs.community.pictures import BAR
from tests.bot.clip_samples import story_clips
from tests.bot.conftest import running_bot
from tests.bot.helpers import private_text, seed_turn
from tests.bot.test_story import PLAYERS, add_finished_turns, begin_story
from tests.discord_double import member

ALICE, BOB, CAROL = PLAYERS
FLY = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
RUN = "Character: Qiqi; Motion: quickly run; Background: day town."


def bar_widths(png: bytes) -> list[int]:
    """The drawn bars, top to bottom: how many pixels of each are filled."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    filled = (pixels == np.array(BAR)).all(axis=-1)  # (H, W)
    rows = np.nonzero(filled.any(axis=1))[0]
    bars = np.split(rows, np.nonzero(np.diff(rows) > 1)[0] + 1) if rows.size else []
    return [int(filled[bar[len(bar) // 2]].sum()) for bar in bars]


def fields(followup) -> dict[str, str]:
    (embed,) = followup.json["embeds"]
    return {field["name"]: field["value"] for field in embed["fields"]}


def picture(followup) -> bytes:
    (image,) = [f for f in followup.files if f.filename.endswith(".png")]
    return image.data


async def play_a_week(double, settings, tmp_path) -> None:
    """Alice plays three turns of her own (two flights and a run); Bob and Carol one story turn each."""
    await begin_story(double)  # Alice, Bob and Carol join "Night flight"
    for line in (FLY, RUN, FLY):
        await seed_turn(settings, double.guild.id, double.guild.channel.id, ALICE.id, line=line, done=True)
    await add_finished_turns(settings, story_clips(tmp_path / "clips", turns=2))  # seq 1 Bob's, seq 2 Carol's


async def test_a_profile_shows_turns_stories_and_favourite_actions(double, bot_settings, tmp_path):
    async with running_bot(double, bot_settings):
        await play_a_week(double, bot_settings, tmp_path)
        (followup,) = await (await double.slash("profile", user=BOB)).followups()
        (alice,) = await (await double.slash("profile", {"player": ALICE}, user=BOB)).followups()
    told = fields(alice)
    assert (told["turns played"], told["stories joined"]) == ("3", "1")
    assert told["favourite actions"] == "fly on broomstick (2), run (1)"
    assert bar_widths(picture(alice)) == [180, 90]  # two flights against one run
    assert fields(followup)["turns played"] == "1"  # Bob's own


async def test_the_board_ranks_this_weeks_players_and_stories(double, bot_settings, tmp_path):
    async with running_bot(double, bot_settings):
        await play_a_week(double, bot_settings, tmp_path)
        (followup,) = await (await double.slash("board", user=CAROL)).followups()
    told = fields(followup)
    assert told["players, turns"].splitlines()[0] == f"1. <@{ALICE.id}> (Qiqi): 3"
    assert told["stories, turns"] == "1. Night flight: 2"
    assert bar_widths(picture(followup)) == [180, 60, 60, 180]  # players 3, 1, 1; the story's 2


async def test_a_profile_of_someone_who_never_played_here_is_refused_privately(double, bot_settings):
    async with running_bot(double, bot_settings):
        handle = await double.slash("profile", {"player": member("dora")}, user=ALICE)
        text = private_text(await handle.answer())
    assert "has no character on this server" in text
