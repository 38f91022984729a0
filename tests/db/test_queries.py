"""Each query's behaviour against a real, migrated SQLite file."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, timedelta

import pytest
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import undefer

from db import jobs as j
from db import queries as q
from db.base import utcnow
from db.models import Character, GuildSettings, Job, JobKind, JobStatus, Player, Turn
from game.contract import TurnResult
from game.errors import StoryClosedError
from game.history import DEFAULT_WINDOW

Sessions = async_sessionmaker[AsyncSession]
MakeResult = Callable[..., TurnResult]

GUILD, CHANNEL = 1_000_000_000_000_000_001, 2_000_000_000_000_000_002  # real snowflakes exceed 32 bits
ALICE, BOB, CAROL = 11, 22, 33
LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."


async def _character(sessions: Sessions, user_id: int = ALICE, name: str = "Qiqi") -> int:
    async with sessions() as s, s.begin():
        return (await q.get_or_create_character(s, GUILD, user_id, name)).id


async def _queue(sessions: Sessions, character_id: int, story_id: int | None = None, line: str = LINE) -> int:
    async with sessions() as s, s.begin():
        _, job = await j.create_turn(s, character_id, line, seed=1, model="tiny", story=story_id, user_id=ALICE)
        return job.id


async def _stats(sessions: Sessions, character_id: int) -> tuple[int, int, int]:
    async with sessions() as s:
        c = await s.get_one(Character, character_id)
        return c.stamina, c.social, c.entertainment


async def _apply(sessions: Sessions, job_id: int, result: TurnResult) -> bool:
    async with sessions() as s, s.begin():
        return await j.apply_result(s, job_id, result, clip_key=f"clips/{job_id}.mp4")


async def _play(sessions: Sessions, make_result: MakeResult, character_id: int, story_id: int | None = None) -> int:
    job_id = await _queue(sessions, character_id, story_id)
    assert await _apply(sessions, job_id, make_result(job_id, stamina=1))
    return job_id


# ---- guilds, players, characters ----------------------------------------------------------


async def test_new_guild_gets_settings_from_column_defaults(sessions: Sessions) -> None:
    async with sessions() as s, s.begin():
        guild = await q.get_or_create_guild(s, GUILD, "Anime Club")
        settings = await q.get_guild_settings(s, GUILD)
    assert guild.name == "Anime Club"
    assert (settings.paused, settings.turns_per_hour, settings.max_queued_turns, settings.history_window) == (
        False,
        20,
        10,
        DEFAULT_WINDOW,
    )


async def test_get_or_create_twice_makes_one_guild_one_player(sessions: Sessions) -> None:
    for _ in range(2):
        async with sessions() as s, s.begin():
            await q.get_or_create_player(s, GUILD, ALICE)
    async with sessions() as s:
        assert len((await s.execute(select(Player))).all()) == 1
        assert len((await s.execute(select(GuildSettings))).all()) == 1


async def test_new_character_starts_at_fifty_and_is_active(sessions: Sessions) -> None:
    character_id = await _character(sessions)
    assert await _stats(sessions, character_id) == (50, 50, 50)
    async with sessions() as s:
        active = await q.active_character(s, GUILD, ALICE)
        assert active is not None and active.id == character_id
        assert active.created_at.tzinfo is UTC


async def test_picking_another_character_makes_it_the_only_active_one(sessions: Sessions) -> None:
    qiqi = await _character(sessions, name="Qiqi")
    sosuke = await _character(sessions, name="Sosuke")
    again = await _character(sessions, name="Qiqi")
    assert again == qiqi
    async with sessions() as s:
        active = await q.active_character(s, GUILD, ALICE)
        assert active is not None and active.id == qiqi
        flags = {i: active for i, active in await s.execute(select(Character.id, Character.is_active))}
    assert flags == {qiqi: True, sosuke: False}


async def test_second_active_character_is_refused_by_the_database(sessions: Sessions) -> None:
    await _character(sessions, name="Qiqi")
    async with sessions() as s:
        player = await q.get_or_create_player(s, GUILD, ALICE)
        s.add(Character(player_id=player.id, name="Sosuke", is_active=True))
        with pytest.raises(IntegrityError, match=r"(?i)unique"):
            await s.flush()


async def test_stats_outside_0_to_100_are_refused_by_the_database(sessions: Sessions) -> None:
    character_id = await _character(sessions)
    async with sessions() as s:
        (await s.get_one(Character, character_id)).stamina = 101
        with pytest.raises(IntegrityError, match=r"(?i)check"):
            await s.flush()


# ---- applying results ---------------------------------------------------------------------


async def test_apply_result_applies_state_arithmetic(sessions: Sessions, make_result: MakeResult) -> None:
    character_id = await _character(sessions)
    job_id = await _queue(sessions, character_id)
    assert await _apply(sessions, job_id, make_result(job_id, stamina=2, social=-3, entertainment=5))
    assert await _stats(sessions, character_id) == (60, 35, 75)


async def test_apply_result_clamps_to_0_and_100(sessions: Sessions, make_result: MakeResult) -> None:
    character_id = await _character(sessions)
    async with sessions() as s, s.begin():
        c = await s.get_one(Character, character_id)
        c.stamina, c.social, c.entertainment = 95, 10, 100
    job_id = await _queue(sessions, character_id)
    assert await _apply(sessions, job_id, make_result(job_id, stamina=5, social=-5, entertainment=1))
    assert await _stats(sessions, character_id) == (100, 0, 100)


async def test_apply_result_stores_the_turn_and_finishes_the_job(sessions: Sessions, make_result: MakeResult) -> None:
    character_id = await _character(sessions)
    job_id = await _queue(sessions, character_id)
    assert await _apply(sessions, job_id, make_result(job_id, stamina=1, social=2, entertainment=3, motion=-4))
    async with sessions() as s:
        job = await s.get_one(Job, job_id)
        turn = await s.get_one(Turn, job.turn_id, options=[undefer(Turn.representation)])
    assert job.status is JobStatus.DONE and job.applied_at is not None and job.progress == 1.0
    assert (turn.d_motion, turn.d_social, turn.d_entertainment, turn.d_stamina) == (-4, 2, 3, 1)
    assert (turn.stamina_after, turn.social_after, turn.entertainment_after) == (55, 60, 65)
    assert (turn.flow, turn.representation, turn.clip_key) == (1.5, f"rep-{job_id}".encode(), f"clips/{job_id}.mp4")


async def test_apply_result_happens_exactly_once(sessions: Sessions, make_result: MakeResult) -> None:
    character_id = await _character(sessions)
    job_id = await _queue(sessions, character_id)
    result = make_result(job_id, stamina=5)
    assert await _apply(sessions, job_id, result) is True
    assert await _apply(sessions, job_id, result) is False
    assert await _stats(sessions, character_id) == (75, 50, 50)


async def test_cancelled_job_is_not_applied(sessions: Sessions, make_result: MakeResult) -> None:
    character_id = await _character(sessions)
    job_id = await _queue(sessions, character_id)
    async with sessions() as s, s.begin():
        assert await j.cancel_job(s, job_id)
    assert await _apply(sessions, job_id, make_result(job_id, stamina=5)) is False
    assert await _stats(sessions, character_id) == (50, 50, 50)
    async with sessions() as s:
        job = await s.get_one(Job, job_id)
        assert job.status is JobStatus.CANCELLED and job.applied_at is None


async def test_result_for_another_job_is_refused(sessions: Sessions, make_result: MakeResult) -> None:
    character_id = await _character(sessions)
    job_id = await _queue(sessions, character_id)
    with pytest.raises(j.ResultMismatchError):
        await _apply(sessions, job_id, make_result(job_id + 100))
    assert await _stats(sessions, character_id) == (50, 50, 50)
    async with sessions() as s:
        assert (await s.get_one(Job, job_id)).status is JobStatus.QUEUED  # the claim was rolled back


async def test_apply_result_racing_itself_applies_once(sessions: Sessions, make_result: MakeResult) -> None:
    character_id = await _character(sessions)
    job_id = await _queue(sessions, character_id)
    result = make_result(job_id, stamina=5)
    outcomes = await asyncio.gather(*(_apply(sessions, job_id, result) for _ in range(3)))
    assert sorted(outcomes) == [False, False, True]
    assert await _stats(sessions, character_id) == (75, 50, 50)


# ---- job life cycle -----------------------------------------------------------------------


async def _run(s: AsyncSession, job_id: int) -> bool:
    """Send and start a job, as the outbox and the supervisor do."""
    soon = utcnow() + timedelta(minutes=1)
    return await j.mark_sent(s, job_id, soon) and await j.mark_started(s, job_id, soon)


async def test_job_moves_queued_running_failed_and_then_stays_put(sessions: Sessions) -> None:
    job_id = await _queue(sessions, await _character(sessions))
    async with sessions() as s, s.begin():
        assert await _run(s, job_id)
        assert not await _run(s, job_id)
        assert await j.update_progress(s, job_id, 5, 20)
        assert await j.fail_job(s, job_id, "CUDA out of memory")
        assert not await j.update_progress(s, job_id, 6, 20)
        assert not await j.cancel_job(s, job_id)
    info = None
    async with sessions() as s:
        info = await j.get_job(s, job_id)
        job = await s.get_one(Job, job_id)
    assert info is not None and info.status is JobStatus.FAILED and (info.step, info.total) == (5, 20)
    assert info.progress == 0.25 and job.error == "CUDA out of memory" and job.finished_at is not None


async def test_jobs_in_flight_lists_queued_and_running_oldest_first(sessions: Sessions) -> None:
    a, b, c = [await _queue(sessions, await _character(sessions, user)) for user in (ALICE, BOB, CAROL)]
    async with sessions() as s, s.begin():
        await _run(s, b)
        await j.cancel_job(s, a)
        in_flight = await j.jobs_in_flight(s)
        assert await j.has_turn_in_flight(s, in_flight[0].character_id)
    assert [(j.id, j.status) for j in in_flight] == [(b, JobStatus.RUNNING), (c, JobStatus.QUEUED)]


async def test_queue_position_counts_queued_jobs_ahead(sessions: Sessions) -> None:
    jobs = [await _queue(sessions, await _character(sessions, user)) for user in (ALICE, BOB, CAROL, 44)]
    async with sessions() as s, s.begin():
        assert [await j.queue_position(s, job) for job in jobs] == [0, 1, 2, 3]
        await _run(s, jobs[0])  # running is not queued: no longer ahead of anyone
        await j.cancel_job(s, jobs[1])
        assert [await j.queue_position(s, job) for job in jobs] == [None, None, 0, 1]


# ---- stories ------------------------------------------------------------------------------


async def _story(sessions: Sessions, channel_id: int = CHANNEL) -> int:
    async with sessions() as s, s.begin():
        return (await q.create_story(s, GUILD, channel_id, "Night flight", created_by=ALICE)).id


async def test_one_active_story_per_channel(sessions: Sessions) -> None:
    first = await _story(sessions)
    with pytest.raises(IntegrityError, match=r"(?i)unique"):
        await _story(sessions)
    await _story(sessions, channel_id=CHANNEL + 1)  # another channel is fine
    async with sessions() as s, s.begin():
        assert await q.end_story(s, first)
    second = await _story(sessions)  # an archived story frees its channel
    async with sessions() as s:
        active = await q.active_story(s, CHANNEL)
        assert active is not None and active.id == second


async def test_story_seq_follows_queue_order_across_three_players(sessions: Sessions) -> None:
    story_id = await _story(sessions)
    characters = [await _character(sessions, user) for user in (ALICE, BOB, CAROL)]
    async with sessions() as s, s.begin():
        members = [await q.join_story(s, story_id, c) for c in characters]
        assert [m.position for m in members] == [0, 1, 2]
    for character_id in characters * 2:
        await _queue(sessions, character_id, story_id)
    async with sessions() as s:
        rows = [tuple(r) for r in await s.execute(select(Turn.seq, Turn.character_id).order_by(Turn.id))]
        kinds = set((await s.execute(select(Job.kind))).scalars())
    assert rows == list(zip(range(1, 7), characters * 2, strict=True))
    assert kinds == {JobKind.STORY}


async def test_story_turns_queued_at_once_get_distinct_seqs(sessions: Sessions) -> None:
    story_id = await _story(sessions)
    characters = [await _character(sessions, user) for user in (ALICE, BOB, CAROL)]
    await asyncio.gather(*(_queue(sessions, c, story_id) for c in characters))
    async with sessions() as s:
        assert sorted((await s.execute(select(Turn.seq))).scalars()) == [1, 2, 3]


async def test_turn_in_an_ended_story_is_refused(sessions: Sessions) -> None:
    story_id = await _story(sessions)
    character_id = await _character(sessions)
    async with sessions() as s, s.begin():
        await q.end_story(s, story_id)
    with pytest.raises(StoryClosedError):
        await _queue(sessions, character_id, story_id)


async def test_build_history_for_a_story_uses_its_turns_across_players_in_order(
    sessions: Sessions, make_result: MakeResult
) -> None:
    story_id = await _story(sessions)
    alice, bob, carol = [await _character(sessions, user) for user in (ALICE, BOB, CAROL)]
    await _play(sessions, make_result, alice)  # Alice's solo turn: not part of the story
    played = [await _play(sessions, make_result, c, story_id) for c in (alice, bob, carol, alice)]
    await _queue(sessions, bob, story_id)  # in flight: never history
    async with sessions() as s:
        story = await q.active_story(s, CHANNEL)
        assert story is not None
        history = await j.build_history(s, story, window=5)
        assert [h.representation for h in history] == [f"rep-{j}".encode() for j in played]
        assert [h.representation for h in await j.build_history(s, story, window=3)] == [
            f"rep-{j}".encode() for j in played[-2:]
        ]
        assert await j.build_history(s, story, window=1) == []
        with pytest.raises(ValueError, match="window"):
            await j.build_history(s, story, window=6)


async def test_build_history_for_a_character_is_its_completed_turns(
    sessions: Sessions, make_result: MakeResult
) -> None:
    alice, bob = await _character(sessions, ALICE), await _character(sessions, BOB)
    first = await _play(sessions, make_result, alice)
    await _play(sessions, make_result, bob)
    cancelled = await _queue(sessions, alice)
    async with sessions() as s, s.begin():
        await j.cancel_job(s, cancelled)
    second = await _play(sessions, make_result, alice)
    async with sessions() as s:
        character = await s.get_one(Character, alice)
        history = await j.build_history(s, character, window=3)
    assert [h.representation for h in history] == [f"rep-{first}".encode(), f"rep-{second}".encode()]
    assert history[0].instruction == LINE and history[0].deltas.stamina == 1


async def test_reading_turns_leaves_their_representations_in_the_database(
    sessions: Sessions, make_result: MakeResult
) -> None:
    """A representation is 868 KB at the published sizes: only a prompt's history loads it."""
    alice = await _character(sessions)
    job_id = await _play(sessions, make_result, alice)
    async with sessions() as s:
        (listed,) = await q.recent_turns(s, alice)  # /history
    async with sessions() as s:
        _, turn, _ = await j.turn_of_job(s, job_id)  # the delivery, the buttons
    async with sessions() as s:
        (history,) = await j.build_history(s, await s.get_one(Character, alice), window=2)
    assert "representation" in inspect(listed).unloaded and "representation" in inspect(turn).unloaded
    assert history.representation == f"rep-{job_id}".encode()
