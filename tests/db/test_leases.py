"""Leases and due claims: of the bot processes asking, one does the duty; a stopped or dead holder is taken over."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from db.base import utcnow
from db.leases import claim_due, give_up, holder_of, take
from tests.db.conftest import Sessions

MINUTE = timedelta(minutes=1)


async def _take(sessions: Sessions, holder: str, at=None, length: timedelta = MINUTE) -> bool:
    now = at or utcnow()
    async with sessions() as s, s.begin():
        return await take(s, "outbox", holder, now + length, now)


async def _holder(sessions: Sessions, at=None) -> str | None:
    async with sessions() as s:
        return await holder_of(s, "outbox", at or utcnow())


async def test_the_first_process_takes_a_free_lease_and_the_second_is_refused(sessions: Sessions) -> None:
    assert await _take(sessions, "a")
    assert not await _take(sessions, "b")
    assert await _holder(sessions) == "a"


async def test_the_holder_renews_its_lease(sessions: Sessions) -> None:
    now = utcnow()
    assert await _take(sessions, "a", now)
    assert await _take(sessions, "a", now + MINUTE / 2)
    assert await _holder(sessions, now + MINUTE) == "a"  # past the first length: renewed


async def test_a_lease_its_holder_stopped_renewing_is_taken_over_once_it_ran_out(sessions: Sessions) -> None:
    now = utcnow()
    assert await _take(sessions, "a", now)
    assert not await _take(sessions, "b", now + MINUTE - timedelta(seconds=1))
    assert await _take(sessions, "b", now + MINUTE)
    assert not await _take(sessions, "a", now + MINUTE)  # the old holder, back, is refused
    assert await _holder(sessions, now + MINUTE) == "b"


async def test_a_lease_given_up_is_taken_at_once(sessions: Sessions) -> None:
    assert await _take(sessions, "a")
    async with sessions() as s, s.begin():
        await give_up(s, "outbox", "a", utcnow())
    assert await _take(sessions, "b")


async def test_only_its_holder_gives_a_lease_up(sessions: Sessions) -> None:
    assert await _take(sessions, "a")
    async with sessions() as s, s.begin():
        await give_up(s, "outbox", "b", utcnow())
    assert not await _take(sessions, "b")


async def test_of_two_processes_asking_at_once_for_a_free_lease_exactly_one_holds_it(
    two_bots: tuple[Sessions, Sessions],
) -> None:
    for round_ in range(8):
        name = f"duty{round_}"
        now = utcnow()

        async def ask(sessions: Sessions, holder: str, name: str = name, now=now) -> bool:
            async with sessions() as s, s.begin():
                return await take(s, name, holder, now + MINUTE, now)

        got = await asyncio.gather(ask(two_bots[0], "a"), ask(two_bots[1], "b"))
        assert sorted(got) == [False, True]


async def test_a_due_duty_is_claimed_by_one_process_once_an_interval(two_bots: tuple[Sessions, Sessions]) -> None:
    async def claim(sessions: Sessions, holder: str, now) -> bool:
        async with sessions() as s, s.begin():
            return await claim_due(s, "retention", holder, now + MINUTE, now)

    now = utcnow()
    first = await asyncio.gather(claim(two_bots[0], "a", now), claim(two_bots[1], "b", now))
    assert sorted(first) == [False, True]
    assert not await claim(two_bots[0], "a", now + MINUTE / 2)  # not due yet, even for the one that did it
    assert not await claim(two_bots[1], "b", now + MINUTE / 2)
    later = now + MINUTE
    again = await asyncio.gather(claim(two_bots[0], "a", later), claim(two_bots[1], "b", later))
    assert sorted(again) == [False, True]
