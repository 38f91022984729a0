"""Two bots (or two shards) on one database, submitting at the same instant: the one-at-a-time rules hold.

Each "bot" is an engine of its own, as two processes would have; each round both submit at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sqlalchemy import select, update

from bot.errors import Refusal
from bot.turns import check_capacity
from db import jobs as j
from db import queries as q
from db.models import Character, GuildSettings, Job, JobStatus
from game.errors import GameError, TurnInFlightError
from tests.db.conftest import Sessions

GUILD, CHANNEL = 1_000_000_000_000_000_001, 2_000_000_000_000_000_002
ALICE, BOB = 11, 22
LINE = "Character: {name}; Motion: wave; Background: town."
ROUNDS = 12
IN_FLIGHT_REFUSAL = str(TurnInFlightError())


async def _character(sessions: Sessions, user_id: int, name: str) -> int:
    async with sessions() as s, s.begin():
        return (await q.get_or_create_character(s, GUILD, user_id, name)).id


async def _finish_all(sessions: Sessions, status: JobStatus = JobStatus.CANCELLED) -> None:
    async with sessions() as s, s.begin():
        await s.execute(update(Job).where(j.status_in(JobStatus.QUEUED, JobStatus.RUNNING)).values(status=status))


async def _in_flight(sessions: Sessions) -> int:
    async with sessions() as s:
        return len((await s.execute(select(Job.id).where(j.status_in(JobStatus.QUEUED, JobStatus.RUNNING)))).all())


async def _race(*attempts: Callable[[], Awaitable[int]]) -> list[int | str]:
    """Run the attempts at once; each gives a job id, or the sentence it was refused with."""

    async def one(attempt: Callable[[], Awaitable[int]]) -> int | str:
        try:
            return await attempt()
        except (Refusal, GameError) as exc:
            return str(exc)

    return list(await asyncio.gather(*(one(a) for a in attempts)))


async def test_the_database_alone_queues_one_turn_when_two_bots_queue_for_one_player_at_once(
    two_bots: tuple[Sessions, Sessions],
) -> None:
    """No check first: the partial unique index is what refuses, even across the player's two characters."""
    qiqi = await _character(two_bots[0], ALICE, "Sosuke")
    sosuke = await _character(two_bots[0], ALICE, "Qiqi")  # the player switched: two characters, one player
    for round_ in range(ROUNDS):
        barrier = asyncio.Barrier(2)

        def queue(sessions: Sessions, character_id: int, barrier: asyncio.Barrier = barrier) -> Callable:
            async def attempt() -> int:
                async with sessions() as s, s.begin():
                    await barrier.wait()  # both hold a session; neither has written yet
                    _, job = await j.create_turn(
                        s, character_id, LINE.format(name="Qiqi"), 1, "toy", guild_id=GUILD, user_id=ALICE
                    )
                    return job.id

            return attempt

        second = qiqi if round_ % 2 else sosuke
        outcomes = await _race(queue(two_bots[0], qiqi), queue(two_bots[1], second))
        assert sorted(map(type, outcomes), key=str) == [int, str], outcomes
        assert IN_FLIGHT_REFUSAL in outcomes
        assert await _in_flight(two_bots[0]) == 1
        await _finish_all(two_bots[0])


async def _submit(sessions: Sessions, user_id: int) -> int:
    """The bot's own path (``bot.turns.submit_turn``): the checks that only read, in a session of their own,
    then one transaction for what must be counted and written at once."""
    async with sessions() as s:
        settings = await q.get_guild_settings(s, GUILD)
        found = await q.active_character(s, GUILD, user_id)
        assert found is not None
    async with sessions() as s, s.begin():
        character = await s.get_one(Character, found.id)
        await check_capacity(s, settings, user_id, character)
        _, job = await j.create_turn(
            s,
            character,
            LINE.format(name=character.name),
            1,
            "toy",
            guild_id=GUILD,
            channel_id=CHANNEL,
            user_id=user_id,
        )
        return job.id


async def test_two_bots_submitting_for_one_player_at_once_accept_one_and_refuse_the_other_as_today(
    two_bots: tuple[Sessions, Sessions],
) -> None:
    await _character(two_bots[0], ALICE, "Qiqi")
    for _ in range(ROUNDS):
        outcomes = await _race(lambda: _submit(two_bots[0], ALICE), lambda: _submit(two_bots[1], ALICE))
        assert sorted(map(type, outcomes), key=str) == [int, str], outcomes
        assert IN_FLIGHT_REFUSAL in outcomes
        await _finish_all(two_bots[0])


async def _set(sessions: Sessions, **values: int) -> None:
    async with sessions() as s, s.begin():
        await q.get_guild_settings(s, GUILD)
        await s.execute(update(GuildSettings).where(GuildSettings.guild_id == GUILD).values(**values))


async def test_the_hourly_quota_holds_when_two_bots_submit_for_one_player_at_once(
    two_bots: tuple[Sessions, Sessions],
) -> None:
    await _character(two_bots[0], ALICE, "Qiqi")
    await _set(two_bots[0], turns_per_hour=3)
    accepted = 0
    for _ in range(ROUNDS // 2):
        outcomes = await _race(lambda: _submit(two_bots[0], ALICE), lambda: _submit(two_bots[1], ALICE))
        accepted += sum(isinstance(o, int) for o in outcomes)
        await _finish_all(two_bots[0], JobStatus.DONE)
    assert accepted == 3
    assert "per hour" in (await _race(lambda: _submit(two_bots[1], ALICE)))[0]


async def test_the_servers_queue_cap_holds_when_two_bots_submit_for_two_players_at_once(
    two_bots: tuple[Sessions, Sessions],
) -> None:
    await _character(two_bots[0], ALICE, "Qiqi")
    await _character(two_bots[0], BOB, "Sosuke")
    await _set(two_bots[0], max_queued_turns=1)
    for _ in range(ROUNDS):
        outcomes = await _race(lambda: _submit(two_bots[0], ALICE), lambda: _submit(two_bots[1], BOB))
        assert sorted(map(type, outcomes), key=str) == [int, str], outcomes
        assert any("queue is full" in str(o) for o in outcomes)
        assert await _in_flight(two_bots[0]) == 1
        await _finish_all(two_bots[0])


async def test_two_bots_writing_one_setting_at_once_both_succeed_and_the_last_write_stays(
    two_bots: tuple[Sessions, Sessions],
) -> None:
    """Two bots started together both store the commands' hash: the second waits for the first's row instead of
    failing its start on the primary key (CI, PostgreSQL), whatever the order they commit in."""
    first_wrote = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        async with two_bots[0]() as s, s.begin():
            await q.set_app_state(s, "commands_hash:global", "one")
            first_wrote.set()
            await release.wait()

    async def second() -> None:
        await first_wrote.wait()
        async with two_bots[1]() as s, s.begin():
            await q.set_app_state(s, "commands_hash:global", "two")

    holding = asyncio.create_task(first())
    waiting = asyncio.create_task(second())
    await asyncio.sleep(0.3)  # the second's write is now waiting on the first's uncommitted row (or on SQLite's lock)
    release.set()
    await asyncio.wait_for(asyncio.gather(holding, waiting), 30)
    async with two_bots[0]() as s:
        assert await q.get_app_state(s, "commands_hash:global") == "two"


async def test_two_bots_asking_a_new_database_for_its_game_id_at_once_get_the_same_one(
    two_bots: tuple[Sessions, Sessions],
) -> None:
    async with two_bots[0]() as s, s.begin():
        await s.execute(q.delete(q.AppState).where(q.AppState.key == q.GAME_ID))

    async def ask(sessions: Sessions) -> str:
        async with sessions() as s, s.begin():
            return await q.game_id(s)

    first, second = await asyncio.gather(ask(two_bots[0]), ask(two_bots[1]))
    assert first == second
