"""Jobs in the database: each move is one guarded UPDATE, the outbox, story order, history that never mixes models."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from db import jobs as j
from db import queries as q
from db.base import utcnow
from db.models import Job, JobStatus, Turn
from game.contract import TurnResult

Sessions = async_sessionmaker[AsyncSession]
GUILD = 1_000_000_000_000_000_001
LINE = "Character: {name}; Motion: wave; Background: town."
SOON = timedelta(minutes=1)


async def _character(sessions: Sessions, user_id: int, name: str = "Qiqi") -> int:
    async with sessions() as s, s.begin():
        return (await q.get_or_create_character(s, GUILD, user_id, name)).id


async def _queue(sessions: Sessions, character_id: int, *, story: int | None = None, name="Qiqi", key=None) -> int:
    async with sessions() as s, s.begin():
        _, job = await j.create_turn(s, character_id, LINE.format(name=name), 1, "tiny", model_key=key, story=story)
        return job.id


async def _status(sessions: Sessions, job_id: int) -> JobStatus:
    async with sessions() as s:
        return (await s.get_one(Job, job_id)).status


async def _force(sessions: Sessions, job_id: int, status: JobStatus) -> None:
    async with sessions() as s, s.begin():
        await s.execute(update(Job).where(Job.id == job_id).values(status=status, sent_at=utcnow()))


MOVES: dict[str, tuple[Callable[[AsyncSession, int], Awaitable[bool]], set[JobStatus]]] = {
    "sent": (lambda s, i: j.mark_sent(s, i, utcnow() + SOON), {JobStatus.QUEUED}),
    "started": (lambda s, i: j.mark_started(s, i, utcnow() + SOON), {JobStatus.QUEUED}),
    "beat": (lambda s, i: j.beat(s, i, utcnow() + SOON), {JobStatus.RUNNING}),
    "handed back": (lambda s, i: j.hand_back(s, i, utcnow() + SOON, "gone"), {JobStatus.RUNNING}),
    "failed": (lambda s, i: j.fail_job(s, i, "boom"), {JobStatus.QUEUED, JobStatus.RUNNING}),
    "cancelled": (lambda s, i: j.cancel_job(s, i), {JobStatus.QUEUED, JobStatus.RUNNING}),
    "expired": (lambda s, i: j.expire_job(s, i), {JobStatus.QUEUED}),
    "requeued": (lambda s, i: j.requeue(s, i), {JobStatus.QUEUED}),
}


@pytest.mark.parametrize("status", list(JobStatus))
@pytest.mark.parametrize("name", list(MOVES))
async def test_each_move_changes_only_a_job_in_one_of_its_sources(sessions: Sessions, name: str, status) -> None:
    job_id = await _queue(sessions, await _character(sessions, 1))
    await _force(sessions, job_id, status)
    if name == "sent":  # the outbox's move is for a job not sent yet
        async with sessions() as s, s.begin():
            await s.execute(update(Job).values(sent_at=None))
    apply, sources = MOVES[name]
    async with sessions() as s, s.begin():
        moved = await apply(s, job_id)
    assert moved is (status in sources)
    if not moved:
        assert await _status(sessions, job_id) is status


async def test_a_cancel_racing_a_result_lets_exactly_one_win(sessions: Sessions, make_result) -> None:
    async def cancel(job_id: int) -> bool:
        async with sessions() as s, s.begin():
            return await j.cancel_job(s, job_id)

    async def apply(job_id: int, result: TurnResult) -> bool:
        async with sessions() as s, s.begin():
            return await j.apply_result(s, job_id, result, None)

    for _ in range(5):
        job_id = await _queue(sessions, await _character(sessions, 2))
        outcomes = await asyncio.gather(cancel(job_id), apply(job_id, make_result(job_id, stamina=1)))
        assert sorted(outcomes) == [False, True]
        assert await _status(sessions, job_id) in (JobStatus.CANCELLED, JobStatus.DONE)


async def test_two_outboxes_sending_the_same_job_record_one_send(sessions: Sessions) -> None:
    job_id = await _queue(sessions, await _character(sessions, 3))

    async def send() -> bool:
        async with sessions() as s, s.begin():
            return await j.mark_sent(s, job_id, utcnow() + SOON)

    assert sorted(await asyncio.gather(send(), send())) == [False, True]
    async with sessions() as s:
        assert (await s.get_one(Job, job_id)).attempts == 1


async def test_a_send_keeps_the_deadline_the_player_was_given(sessions: Sessions) -> None:
    job_id = await _queue(sessions, await _character(sessions, 4))
    promised = utcnow() + timedelta(seconds=90)
    async with sessions() as s, s.begin():
        await s.execute(update(Job).values(deadline_at=promised))
        await j.mark_sent(s, job_id, utcnow() + timedelta(hours=1))
    async with sessions() as s:
        assert abs((await s.get_one(Job, job_id)).deadline_at - promised) < timedelta(seconds=1)


async def test_only_a_cancelled_job_that_was_sent_waits_for_its_workers_to_be_told(sessions: Sessions) -> None:
    sent, unsent = [await _queue(sessions, await _character(sessions, user)) for user in (7, 8)]
    async with sessions() as s, s.begin():
        await j.mark_sent(s, sent, utcnow() + SOON)
        assert await j.cancel_job(s, sent) and await j.cancel_job(s, unsent)
    async with sessions() as s:
        assert [job.id for job in await j.cancels_to_mark(s)] == [sent]
    async with sessions() as s, s.begin():
        await j.note_cancel_marked(s, sent)
    async with sessions() as s:
        assert await j.cancels_to_mark(s) == []


async def test_a_handed_back_job_goes_back_to_the_outbox(sessions: Sessions) -> None:
    job_id = await _queue(sessions, await _character(sessions, 5))
    async with sessions() as s, s.begin():
        await j.mark_sent(s, job_id, utcnow() + SOON)
        await j.mark_started(s, job_id, utcnow() + SOON)
        assert await j.hand_back(s, job_id, utcnow() + SOON, "its worker stopped reporting")
    async with sessions() as s:
        assert [job.id for job in await j.jobs_to_send(s)] == [job_id]


async def _sent_again(sessions: Sessions, job_id: int, started: bool) -> j.JobInfo:
    """What another process did while one slept: took the turn back (its worker vanished, or the broker lost its
    message) and sent it again, and, if ``started``, saw a new worker start it. Returns what the sleeper read: the
    job running if ``started``, else sent and waiting."""
    async with sessions() as s, s.begin():
        await j.mark_sent(s, job_id, utcnow() + SOON)
        read = await j.get_job(s, job_id)
        if started:
            await j.mark_started(s, job_id, utcnow() + SOON, read)
            read = await j.get_job(s, job_id)
            assert await j.hand_back(s, job_id, utcnow() + SOON, "gone", read)
        else:
            assert await j.requeue(s, job_id, read)
        assert await j.mark_sent(s, job_id, utcnow() + SOON)
        if started:
            assert await j.mark_started(s, job_id, utcnow() + SOON, await j.get_job(s, job_id))
    assert read is not None
    return read


@pytest.mark.parametrize(
    ("move", "started"),
    [
        (lambda s, i, read: j.hand_back(s, i, utcnow() + SOON, "stale", read), True),
        (lambda s, i, read: j.fail_job(s, i, "stale", read), True),
        (lambda s, i, read: j.beat(s, i, utcnow() + timedelta(days=1), read), True),
        (lambda s, i, read: j.mark_started(s, i, utcnow() + timedelta(days=1), read), False),
        (lambda s, i, read: j.requeue(s, i, read), False),
        (lambda s, i, read: j.expire_job(s, i, read), False),
    ],
    ids=["hand back", "fail", "beat", "start", "requeue", "expire"],
)
async def test_a_move_decided_from_an_attempt_that_has_since_been_sent_again_changes_nothing(
    sessions: Sessions, move: Callable[[AsyncSession, int, j.JobInfo], Awaitable[bool]], started: bool
) -> None:
    job_id = await _queue(sessions, await _character(sessions, 15))
    read = await _sent_again(sessions, job_id, started)
    async with sessions() as s:
        before = await s.get_one(Job, job_id)
        before = (before.status, before.attempts, before.error, before.deadline_at, before.sent_at)
    async with sessions() as s, s.begin():
        assert not await move(s, job_id, read)
    async with sessions() as s:
        after = await s.get_one(Job, job_id)
        assert (after.status, after.attempts, after.error, after.deadline_at, after.sent_at) == before
        assert after.attempts == read.attempts + 1


async def test_progress_read_from_an_attempt_sent_again_since_is_neither_written_nor_shown(sessions: Sessions) -> None:
    job_id = await _queue(sessions, await _character(sessions, 16))
    read = await _sent_again(sessions, job_id, started=True)
    async with sessions() as s, s.begin():
        assert not await j.update_progress(s, job_id, 40, 50, read)
        assert not await j.in_attempt(s, job_id, read.attempts)
        assert await j.in_attempt(s, job_id, read.attempts + 1)
        assert await j.update_progress(s, job_id, 3, 50, await j.get_job(s, job_id))
    async with sessions() as s:
        assert (await s.get_one(Job, job_id)).step == 3


async def test_progress_read_before_a_hand_back_is_not_shown_even_before_the_turn_is_sent_again(
    sessions: Sessions,
) -> None:
    job_id = await _queue(sessions, await _character(sessions, 17))
    async with sessions() as s, s.begin():
        await j.mark_sent(s, job_id, utcnow() + SOON)
        await j.mark_started(s, job_id, utcnow() + SOON, await j.get_job(s, job_id))
        read = await j.get_job(s, job_id)
        assert read is not None and await j.in_attempt(s, job_id, read.attempts)
        assert await j.hand_back(s, job_id, utcnow() + SOON, "gone", read)
        assert not await j.in_attempt(s, job_id, read.attempts)  # another process told the player a worker stopped


async def test_a_queued_turn_read_before_it_was_started_and_handed_back_is_not_expired_by_that_reading(
    sessions: Sessions,
) -> None:
    """A process reads the turn queued and sent, and pauses; meanwhile a worker starts it, vanishes, and another
    process hands it back (the same attempt, unsent, a new deadline). Woken, the first finds the pickup deadline it
    read has passed: matching the attempt alone, its expiry dropped the handed-back turn."""
    job_id = await _queue(sessions, await _character(sessions, 18))
    async with sessions() as s, s.begin():
        await j.mark_sent(s, job_id, utcnow() + SOON)
        read = await j.get_job(s, job_id)  # the sleeper's reading: queued and sent
        assert await j.mark_started(s, job_id, utcnow() + SOON, read)
        assert await j.hand_back(s, job_id, utcnow() + SOON, "gone", await j.get_job(s, job_id))
    async with sessions() as s, s.begin():
        assert not await j.expire_job(s, job_id, read)
    async with sessions() as s:
        after = await s.get_one(Job, job_id)
    assert (after.status, after.sent_at, after.attempts) == (JobStatus.QUEUED, None, read.attempts)


async def test_a_story_turn_is_sent_only_after_the_turn_before_it_ends(sessions: Sessions, make_result) -> None:
    async with sessions() as s, s.begin():
        story = (await q.create_story(s, GUILD, 77, "Night flight", 1)).id
    first = await _queue(sessions, await _character(sessions, 6), story=story)
    second = await _queue(sessions, await _character(sessions, 7, "Sosuke"), story=story, name="Sosuke")
    async with sessions() as s:
        assert [job.id for job in await j.jobs_to_send(s)] == [first]
    async with sessions() as s, s.begin():
        await j.mark_sent(s, first, utcnow() + SOON)
    async with sessions() as s:
        assert await j.jobs_to_send(s) == []  # the first is in flight: the second waits for its history
    async with sessions() as s, s.begin():
        assert await j.apply_result(s, first, make_result(first), None)
    async with sessions() as s:
        assert [job.id for job in await j.jobs_to_send(s)] == [second]


async def test_history_only_carries_representations_of_the_same_model(sessions: Sessions, make_result) -> None:
    async with sessions() as s, s.begin():
        story = await q.create_story(s, GUILD, 78, "Two pairs", 1)
    qiqi, sosuke = await _character(sessions, 8, "Qiqi"), await _character(sessions, 9, "Sosuke")
    for character, name in ((qiqi, "Qiqi"), (sosuke, "Sosuke"), (qiqi, "Qiqi")):
        job_id = await _queue(sessions, character, story=story.id, name=name, key=f"animegamer:{name.lower()}")
        async with sessions() as s, s.begin():
            assert await j.apply_result(s, job_id, make_result(job_id), None)
    async with sessions() as s:
        story = await s.get_one(type(story), story.id)
        for_qiqi = await j.build_history(s, story, window=5, model_key="animegamer:qiqi")
        for_sosuke = await j.build_history(s, story, window=5, model_key="animegamer:sosuke")
    assert len(for_qiqi) == 2 and len(for_sosuke) == 1
    assert all("Qiqi" in turn.instruction for turn in for_qiqi)


async def test_reset_keeps_the_players_story_turns_as_a_former_players(sessions: Sessions, make_result) -> None:
    async with sessions() as s, s.begin():
        story = (await q.create_story(s, GUILD, 79, "Shared", 1)).id
    character = await _character(sessions, 10)
    solo, shared = await _queue(sessions, character), await _queue(sessions, character, story=story)
    for job_id in (solo, shared):
        async with sessions() as s, s.begin():
            assert await j.apply_result(s, job_id, make_result(job_id), None)
    async with sessions() as s, s.begin():
        await q.reset_character(s, await s.get_one(q.Character, character))
    async with sessions() as s:
        turns = await q.story_turns(s, story)
        remaining = (await s.execute(select(Turn.id, Turn.character_id))).all()
    assert [name for _, name in turns] == [q.FORMER_PLAYER]
    assert len(remaining) == 1 and remaining[0][1] is None  # the solo turn is forgotten, the story's is kept


async def test_an_eta_grows_by_how_often_turns_finish_not_by_how_long_one_runs(sessions: Sessions) -> None:
    now = utcnow()
    finishes = [now - timedelta(seconds=s) for s in (0, 2, 4, 6)] + [now - timedelta(hours=1)]
    for user, finished in enumerate(finishes):
        job = await _queue(sessions, await _character(sessions, 100 + user))
        async with sessions() as session, session.begin():
            await session.execute(
                update(Job)
                .where(Job.id == job)
                .values(status=JobStatus.DONE, started_at=finished - timedelta(seconds=0.1), finished_at=finished)
            )
    async with sessions() as session:
        gap = await j.seconds_between_turns(session, default=60.0)
        one_turn = await j.average_turn_seconds(session, default=60.0)
    assert gap == pytest.approx(2.0)  # the hour-old finish is not part of today's pace
    assert one_turn == pytest.approx(0.1)


async def test_with_fewer_than_two_recent_finishes_the_eta_uses_the_default(sessions: Sessions) -> None:
    job = await _queue(sessions, await _character(sessions, 7))
    async with sessions() as session, session.begin():
        await session.execute(update(Job).where(Job.id == job).values(status=JobStatus.DONE, finished_at=utcnow()))
    async with sessions() as session:
        assert await j.seconds_between_turns(session, default=42.0) == 42.0


async def test_a_turn_keeps_the_label_its_workers_result_gave_whatever_the_model_name(
    sessions: Sessions, make_result
) -> None:
    job_id = await _queue(sessions, await _character(sessions, 9))  # queued as model "tiny"
    result = make_result(job_id).model_copy(update={"model": "full", "label": "full-size model, random weights"})
    async with sessions() as s, s.begin():
        assert await j.apply_result(s, job_id, result, None)
    async with sessions() as s:
        turn = (await s.execute(select(Turn).join(Job, Job.turn_id == Turn.id).where(Job.id == job_id))).scalar_one()
    assert turn.label == "full-size model, random weights"
