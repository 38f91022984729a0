"""Leases and due claims: of the bot processes asking, one does the duty; a stopped or dead holder is taken over."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from db import leases
from db.base import utcnow
from db.leases import (
    STANDING_IN,
    claim_due,
    database_now,
    give_up,
    give_up_all,
    holder_of,
    lock_in_order,
    take,
    take_at,
    take_many,
)
from tests.db.conftest import Sessions

MINUTE = timedelta(minutes=1)


async def _take(sessions: Sessions, holder: str, at=None, length: timedelta = MINUTE) -> bool:
    now = at or utcnow()
    async with sessions() as s, s.begin():
        return await take_at(s, "outbox", holder, now + length, now)


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
        await give_up(s, "outbox", "a")
    assert await _take(sessions, "b")


async def test_only_its_holder_gives_a_lease_up(sessions: Sessions) -> None:
    assert await _take(sessions, "a")
    async with sessions() as s, s.begin():
        await give_up(s, "outbox", "b")
    assert not await _take(sessions, "b")


async def test_of_two_processes_asking_at_once_for_a_free_lease_exactly_one_holds_it(
    two_bots: tuple[Sessions, Sessions],
) -> None:
    for round_ in range(8):
        name = f"duty{round_}"
        now = utcnow()

        async def ask(sessions: Sessions, holder: str, name: str = name, now=now) -> bool:
            async with sessions() as s, s.begin():
                return await take(s, name, holder, MINUTE)

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


class _ThirtySecondsAhead(datetime):
    """This process's wall clock, 30 s ahead of the database's (NTP not yet synced, a VM resumed from a pause)."""

    @classmethod
    def now(cls, tz=None):  # type: ignore[override]
        return datetime.now(tz) + timedelta(seconds=30)


async def test_a_process_whose_clock_runs_ahead_neither_takes_a_live_lease_nor_sees_it_lapsed(
    sessions: Sessions, backend: str, monkeypatch
) -> None:
    if backend != "postgresql":
        pytest.skip("SQLite is one machine's file: the database's clock is that machine's")
    ten = timedelta(seconds=10)
    async with sessions() as s, s.begin():
        assert await take(s, "outbox", "a", ten)
    monkeypatch.setattr(leases, "datetime", _ThirtySecondsAhead)
    async with sessions() as s, s.begin():
        assert not await take(s, "outbox", "b", ten)
    async with sessions() as s:
        assert await holder_of(s, "outbox") == "a"
        assert abs(await database_now(s) - utcnow()) < timedelta(seconds=5)


async def _take_many(sessions: Sessions, names: list[str], holder: str, at, owner: bool = False) -> set[str]:
    async with sessions() as s, s.begin():
        return set(await take_many(s, names, holder, at + MINUTE, at, owner=owner))


async def test_a_stand_in_posts_a_dead_owners_shard_until_the_owner_is_back_and_takes_it_at_once(
    sessions: Sessions,
) -> None:
    now, shards = utcnow(), ["post:0", "post:1"]
    assert await _take_many(sessions, shards[:1], "a", now, owner=True) == {"post:0"}
    assert await _take_many(sessions, shards[1:], "a" + STANDING_IN, now) == {"post:1"}  # nobody had shard 1 yet
    assert await _take_many(sessions, shards[1:], "b", now, owner=True) == {"post:1"}  # its owner: at once
    assert await _take_many(sessions, shards[1:], "a" + STANDING_IN, now) == set()  # the stand-in learns it
    assert await _take_many(sessions, shards[:1], "b" + STANDING_IN, now) == set()  # a live owner's: never
    later = now + MINUTE  # a died: its lease ran out
    assert await _take_many(sessions, shards[:1], "b" + STANDING_IN, later) == {"post:0"}


async def test_a_stopping_process_gives_up_its_posting_leases_and_nothing_else_it_holds(sessions: Sessions) -> None:
    now = utcnow()
    await _take_many(sessions, ["post:0"], "a", now, owner=True)
    await _take_many(sessions, ["post:1"], "a" + STANDING_IN, now)
    assert await _take(sessions, "a")  # the outbox
    async with sessions() as s, s.begin():
        await give_up_all(s, "post:", ["a", "a" + STANDING_IN])
    assert await _take_many(sessions, ["post:0", "post:1"], "b", utcnow(), owner=True) == {"post:0", "post:1"}
    assert await _holder(sessions) == "a"


async def test_an_owner_taking_its_shard_back_from_a_live_stand_in_posts_once_the_stand_ins_lease_has_run_out(
    sessions: Sessions,
) -> None:
    """Until its lease runs out the stand-in may still be sure it posts the shard (it learns otherwise at its next
    renewal): the owner is told to wait till then, and a shard free or its own it may post at once."""
    now = utcnow()
    async with sessions() as s, s.begin():
        assert set(await take_many(s, ["post:0"], "a" + STANDING_IN, now + MINUTE, now)) == {"post:0"}
    soon = now + timedelta(seconds=5)
    async with sessions() as s, s.begin():
        took = await take_many(s, ["post:0", "post:1"], "b", soon + MINUTE, soon, owner=True)
    assert set(took) == {"post:0", "post:1"}
    assert abs(took["post:0"] - (now + MINUTE)) < timedelta(milliseconds=1)  # the stand-in's expiry
    assert took["post:1"] == soon  # nobody held it
    async with sessions() as s, s.begin():
        renewed = await take_many(s, ["post:0"], "b", soon + 2 * MINUTE, soon + MINUTE, owner=True)
    assert renewed == {"post:0": soon + MINUTE}  # its own now


async def test_two_processes_each_owning_one_shard_and_standing_in_for_the_other_renew_at_once_without_deadlock(
    sessions: Sessions,
) -> None:
    """As bot/leases.py renews them: the rows locked in name order first, then taken. Taken in the order each process
    lists them (its own shard, then the other), PostgreSQL found a deadlock and aborted one renewal."""

    async def renew(mine: str, other: str, holder: str) -> None:
        async with sessions() as s, s.begin():
            now = await database_now(s)
            await lock_in_order(s, [mine, other], now)
            await take_many(s, [mine], holder, now + MINUTE, now, owner=True)
            await asyncio.sleep(0.05)  # both hold some rows while they ask for the rest
            await take_many(s, [other], holder + STANDING_IN, now + MINUTE, now)

    for _ in range(5):
        await asyncio.gather(renew("post:0", "post:1", "a"), renew("post:1", "post:0", "b"))
    async with sessions() as s:
        assert (await holder_of(s, "post:0"), await holder_of(s, "post:1")) == ("a", "b")
