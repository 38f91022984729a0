"""/story recap's claim in the database: one recap of a story at a time and one per cooldown, across processes."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from db import queries as q
from db.base import utcnow
from db.models import TurnOrder
from db.recaps import claim_recap, end_recap
from tests.db.conftest import Sessions

GUILD, CHANNEL, ALICE = 1_000_000_000_000_000_001, 2_000_000_000_000_000_002, 11
COOLDOWN = timedelta(minutes=5)
STALE = timedelta(minutes=10)


@pytest.fixture
async def story_id(sessions: Sessions) -> int:
    async with sessions() as s, s.begin():
        return (await q.create_story(s, GUILD, CHANNEL, "Tale", ALICE, TurnOrder.FREE)).id


async def _claim(sessions: Sessions, story_id: int, now, cooldown: timedelta = COOLDOWN):
    async with sessions() as s, s.begin():
        return await claim_recap(s, story_id, now, cooldown, STALE)


async def _end(sessions: Sessions, story_id: int, started) -> None:
    async with sessions() as s, s.begin():
        await end_recap(s, story_id, started)


async def test_a_recap_asked_for_while_one_is_made_is_refused_as_busy(sessions: Sessions, story_id: int) -> None:
    now = utcnow()
    assert (await _claim(sessions, story_id, now, timedelta(0))).claimed
    refused = await _claim(sessions, story_id, now + timedelta(seconds=5), timedelta(0))
    assert not refused.claimed and refused.busy


async def test_a_recap_within_the_cooldown_is_refused_with_when_it_may_be_asked(
    sessions: Sessions, story_id: int
) -> None:
    now = utcnow()
    assert (await _claim(sessions, story_id, now)).claimed
    await _end(sessions, story_id, now)
    refused = await _claim(sessions, story_id, now + timedelta(minutes=1))
    assert not refused.claimed and not refused.busy
    assert abs(refused.again_at - (now + COOLDOWN)) < timedelta(seconds=1)
    assert (await _claim(sessions, story_id, now + COOLDOWN)).claimed


async def test_the_claim_of_a_process_that_died_making_a_recap_is_taken_once_stale(
    sessions: Sessions, story_id: int
) -> None:
    now = utcnow()
    assert (await _claim(sessions, story_id, now, timedelta(0))).claimed  # never ended: its process died
    assert (await _claim(sessions, story_id, now + STALE - timedelta(seconds=1), timedelta(0))).busy
    assert (await _claim(sessions, story_id, now + STALE, timedelta(0))).claimed


async def test_of_two_processes_asking_at_once_one_makes_the_recap(
    two_bots: tuple[Sessions, Sessions], story_id: int
) -> None:
    now = utcnow()
    got = await asyncio.gather(*(_claim(sessions, story_id, now) for sessions in two_bots))
    assert sorted(claim.claimed for claim in got) == [False, True]
    assert [claim.busy for claim in got if not claim.claimed] == [True]
