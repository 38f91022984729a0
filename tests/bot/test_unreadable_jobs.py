"""A bad row fails alone: a turn whose stored instruction this version cannot read (stored before a grammar or model
change) is ended with a reason its player sees and the log names, and every other turn goes on.

The bot runs the published model's routing (one queue per character), where each waiting turn's instruction is
read to find its queue: before, one such row raised inside the supervisor's first step, every tick, and stalled
every duty, the expiry that would have cleared it included.
"""

from __future__ import annotations

import logging
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from db.models import Job, JobStatus
from game.instruction import parse, unreadable
from relay.celery_app import RELEASE_MODEL
from tests.bot.conftest import running_bot, wait_for_db
from tests.bot.helpers import seed_turn
from tests.discord_double import member

BOB = member("bob")
STORED_BEFORE = [
    "Character: Qiqi; Motion: wave",  # a part the grammar now requires
    "Qiqi waves in town",  # free text an older version kept as it was typed
    "Character: Qiqi; Motion: @everyone; Background: town.",  # a check added since
    "x" * 5000,
]


async def a_bad_row_beside_a_good_one(double, settings, stored: str) -> tuple[int, int, list]:
    """The player's turn stored as ``stored`` and Bob's ordinary one, once the bad one failed and the good one was
    sent: their ids, and every job's (id, status, sent_at, error)."""
    channel = double.guild.channel.id
    bad = await seed_turn(settings, double.guild.id, channel, double.player.id, line=stored)
    good = await seed_turn(settings, double.guild.id, channel, BOB.id)
    rows = await wait_for_db(
        settings,
        select(Job.id, Job.status, Job.sent_at, Job.error).order_by(Job.id),
        lambda rows: rows[0][1] == JobStatus.FAILED and rows[1][2] is not None,
    )
    return bad, good, rows


@pytest.mark.parametrize("stored", STORED_BEFORE, ids=["missing part", "free text", "mention", "too long"])
async def test_a_turn_this_version_cannot_read_fails_alone_with_a_reason_and_the_others_go_on(
    double, bot_settings, stored, caplog
):
    settings = bot_settings.model_copy(update={"model": RELEASE_MODEL})
    with caplog.at_level(logging.ERROR, logger="bot.supervisor"):
        async with running_bot(double, settings):
            bad, good, rows = await a_bad_row_beside_a_good_one(double, settings, stored)
            told = await double.wait_until(lambda: double.dms(double.player), 10, "a DM to the player")
    (_, _, _, error), (_, status, _, _) = rows
    assert (rows[0][0], rows[1][0]) == (bad, good)
    assert status is JobStatus.QUEUED  # the other turn was sent to its queue and waits for a worker
    assert "cannot be read by this version" in error
    assert "can no longer be made" in told[0].content and "/act" in told[0].content
    assert any(f"job {bad} failed" in r.getMessage() and "cannot be read" in r.getMessage() for r in caplog.records)


@given(st.text(max_size=300))
def test_any_stored_text_is_either_played_or_given_a_reason_never_an_exception(stored):
    why = unreadable(stored)
    if why is None:
        assert parse(stored).character
    else:
        assert isinstance(why, str) and why


async def test_a_row_whose_parsing_raises_a_type_error_fails_alone_and_the_others_go_on(
    double, bot_settings, monkeypatch
):
    """A parser bug that one stored text trips (a ``TypeError``, not an ``InstructionError``) is that row's alone:
    every duty of the tick that reads the row (the outbox, the queue gauges, the supervisor) goes on for the rest."""
    import game.instruction

    tripping = "Character: Qiqi; Motion: trips the parser; Background: town."
    real_parse = game.instruction.parse

    def buggy_parse(text: str) -> game.instruction.Instruction:
        if text == tripping:
            raise TypeError("'NoneType' object is not subscriptable")
        return real_parse(text)

    for module in list(sys.modules.values()):  # wherever the parser was imported by name
        if getattr(module, "parse", None) is real_parse:
            monkeypatch.setattr(module, "parse", buggy_parse)
    settings = bot_settings.model_copy(update={"model": RELEASE_MODEL})
    async with running_bot(double, settings):
        bad, good, rows = await a_bad_row_beside_a_good_one(double, settings, tripping)
    assert [row[0] for row in rows] == [bad, good]
    assert rows[1][1] is JobStatus.QUEUED  # sent to its queue, waiting for a worker
    assert "TypeError while reading it" in rows[0][3]
