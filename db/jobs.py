"""Jobs and turns in the database: creating them, moving them through ``game.jobs``, reading them back.

Every move is one guarded UPDATE built from ``game.jobs.MOVES``: ``... WHERE id = :id AND status
IN <the event's sources>``, returning the row it changed. Two processes racing to move the same
job (a cancel and a result, two supervisors, a resend and a hand-back) resolve in the database:
one UPDATE matches, the other sees no row and its caller is told False. Nothing here commits;
the caller's transaction is the unit of work.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, case, exists, func, literal_column, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import QueryableAttribute, aliased, undefer

from db import clip_deletes
from db.base import utcnow
from db.models import Character, Job, JobKind, Story, StoryStatus, Turn, new_task_id
from game.contract import HistoryTurn, TurnResult, inline
from game.errors import StoryClosedError, TurnInFlightError
from game.history import MAX_WINDOW, past_turns_for
from game.jobs import IN_FLIGHT, MOVES, Event, JobStatus
from game.schedule import turns_ahead
from game.state import CharacterState, StateDeltas

log = logging.getLogger(__name__)

SEED_LIMIT = 2**63  # seeds are stored in a signed BIGINT (and the contract says < 2**63)


def status_in(*statuses: JobStatus, column: QueryableAttribute[JobStatus] | None = None) -> ColumnElement[bool]:
    """``jobs.status IN ('queued', 'running')`` with the values in the SQL, as the partial indexes' WHERE
    (``db.models.status_sql``): with bound parameters the planner could not use those indexes."""
    return (Job.status if column is None else column).in_([literal_column(f"'{s.value}'") for s in statuses])


class ResultMismatchError(ValueError):
    """A TurnResult was handed to a job it does not belong to: a delivery bug, never data."""


@dataclass(frozen=True)
class JobInfo:
    """A job as the supervisor, the delivery and the progress message need it; safe outside the session."""

    id: int
    task_id: str
    kind: JobKind
    status: JobStatus
    turn_id: int
    character_id: int | None
    story_id: int | None
    seq: int | None
    instruction: str
    model_key: str | None
    progress: float
    step: int
    total: int
    guild_id: int | None
    channel_id: int | None
    user_id: int | None
    progress_message_id: int | None
    result_message_id: int | None
    queued_at: datetime
    started_at: datetime | None
    sent_at: datetime | None
    attempts: int
    deadline_at: datetime | None
    post_attempts: int


# --------------------------------------------------------------------------------------------
# Creating a turn
# --------------------------------------------------------------------------------------------


async def create_turn(
    session: AsyncSession,
    character: Character | int,
    instruction: str,
    seed: int,
    model: str,
    *,
    model_key: str | None = None,
    story: Story | int | None = None,
    kind: JobKind | str | None = None,
    guild_id: int | None = None,
    channel_id: int | None = None,
    user_id: int | None = None,
    task_id: str | None = None,
    deadline_at: datetime | None = None,
) -> tuple[Turn, Job]:
    """A queued turn and its job, not yet sent: the outbox sends it once the caller commits.

    In a story the turn takes the story's next ``seq``: bumping ``stories.last_seq`` with an
    UPDATE takes the write lock first, so two players acting at once get 1 and 2, not 1 and 1.
    ``kind`` defaults to ``story`` for a story turn and ``act`` otherwise.

    A player with a turn in flight gets ``TurnInFlightError``: the database's partial unique index
    refuses the second job even when two bots checked at the same instant and both saw none.
    """
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be in 0..2**63-1, got {seed}")
    story_id = None if story is None else _id(story)
    seq = None
    if story_id is not None:
        bumped = await session.execute(
            update(Story)
            .where(Story.id == story_id, Story.status == StoryStatus.ACTIVE)
            .values(last_seq=Story.last_seq + 1)
            .returning(Story.last_seq)
        )
        seq = bumped.scalar_one_or_none()
        if seq is None:
            raise StoryClosedError(story_id)
    job_kind = JobKind(kind) if kind is not None else (JobKind.STORY if story_id is not None else JobKind.ACT)
    turn = Turn(
        character_id=_id(character),
        story_id=story_id,
        seq=seq,
        instruction=instruction,
        seed=seed,
        model=model,
        model_key=model_key or model,
    )
    job = Job(
        turn=turn,
        task_id=task_id or new_task_id(),
        kind=job_kind,
        guild_id=guild_id,
        channel_id=channel_id,
        user_id=user_id,
        deadline_at=deadline_at,
    )
    session.add_all([turn, job])
    try:
        await session.flush()
    except IntegrityError as exc:
        if _one_in_flight_refused(exc):
            raise TurnInFlightError() from exc
        raise
    return turn, job


def _one_in_flight_refused(exc: IntegrityError) -> bool:
    # PostgreSQL names the index; SQLite names the columns of a unique index instead.
    text = str(exc.orig)
    return "uq_jobs_one_in_flight_per_player" in text or "jobs.guild_id, jobs.user_id" in text


# --------------------------------------------------------------------------------------------
# Moves (game.jobs.MOVES), one guarded UPDATE each
# --------------------------------------------------------------------------------------------


def fenced(read: JobInfo | None) -> tuple[ColumnElement[bool], ...]:
    """The guard of a move decided from a reading of the job: it is still as it was read, in the same state, the same
    send (its time) and the same attempt.

    A process that paused after reading (a GC pause, a frozen VM, a tick stuck on Discord) may wake after another has
    moved the job: started it, handed it back (the same attempt, unsent) or sent it again (the next attempt). Its move
    then matches no row: a turn read as queued and sent is never expired once it was handed back, whatever its
    attempt says.
    """
    if read is None:
        return ()
    sent = Job.sent_at.is_(None) if read.sent_at is None else Job.sent_at == read.sent_at
    return (Job.attempts == read.attempts, Job.status == read.status, sent)


async def _move(session: AsyncSession, job_id: int, event: Event, *guards: ColumnElement[bool], **values: Any) -> bool:
    rule = MOVES[event]
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(rule.sources), *guards)
        .values(status=rule.target, **values)
        .returning(Job.id)
    )
    return _changed(result)


async def mark_sent(session: AsyncSession, job_id: int, deadline: datetime, now: datetime | None = None) -> bool:
    """The outbox handed the task to the broker at ``now`` (the fleet's clock, db.leases.FleetClock). A job that
    already had a deadline keeps it: the player's wait counts from when they asked, not from when the broker came
    back."""
    return await _move(
        session,
        job_id,
        Event.SENT,
        Job.sent_at.is_(None),
        sent_at=now or utcnow(),
        attempts=Job.attempts + 1,
        deadline_at=func.coalesce(Job.deadline_at, deadline),
    )


async def arm_deadline(session: AsyncSession, job_id: int, deadline: datetime) -> bool:
    """Give a story turn that may now be sent its own deadline (it had none while it waited)."""
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED, Job.deadline_at.is_(None))
        .values(deadline_at=deadline)
        .returning(Job.id)
    )
    return _changed(result)


async def mark_started(
    session: AsyncSession, job_id: int, deadline: datetime, read: JobInfo | None = None, now: datetime | None = None
) -> bool:
    """queued -> running: a worker claimed it (seen at ``now``, on the fleet's clock: its run limit counts from it)."""
    return await _move(
        session,
        job_id,
        Event.STARTED,
        Job.sent_at.is_not(None),
        *fenced(read),
        started_at=func.coalesce(Job.started_at, now or utcnow()),
        deadline_at=deadline,
    )


async def beat(session: AsyncSession, job_id: int, deadline: datetime, read: JobInfo | None = None) -> bool:
    """Its worker was seen: the running job's deadline moves on."""
    return await _move(session, job_id, Event.BEAT, *fenced(read), deadline_at=deadline)


async def update_progress(
    session: AsyncSession, job_id: int, step: int, total: int, read: JobInfo | None = None
) -> bool:
    """Record step/total of a running job, for /queue; not a move, yet fenced like one: a reading from before a
    pause never writes an old attempt's step over the new attempt's."""
    if total <= 0 or step < 0:
        raise ValueError(f"progress needs 0 <= step and 0 < total, got {step}/{total}")
    step = min(step, total)
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, *fenced(read))
        .values(step=step, total=total, progress=step / total)
        .returning(Job.id)
    )
    return _changed(result)


async def in_attempt(session: AsyncSession, job_id: int, attempt: int) -> bool:
    """Whether the job is still in flight in the send a process read: what it shows of that reading (a progress
    edit) is shown only then. A hand-back ends the send at once (``sent_at`` cleared), before the next send counts
    an attempt."""
    found = await session.scalar(
        select(Job.id).where(
            Job.id == job_id, Job.attempts == attempt, Job.status.in_(IN_FLIGHT), Job.sent_at.is_not(None)
        )
    )
    return found is not None


async def hand_back(
    session: AsyncSession, job_id: int, deadline: datetime, reason: str, read: JobInfo | None = None
) -> bool:
    """running -> queued and not sent: its worker vanished, so the outbox sends it again."""
    return await _move(
        session,
        job_id,
        Event.HANDED_BACK,
        *fenced(read),
        sent_at=None,
        deadline_at=deadline,
        error=reason,
        step=0,
        progress=0.0,
    )


async def requeue(session: AsyncSession, job_id: int, read: JobInfo | None = None) -> bool:
    """queued and sent -> queued and not sent: the broker lost its message, so the outbox sends it again."""
    return await _move(session, job_id, Event.REQUEUED, Job.sent_at.is_not(None), *fenced(read), sent_at=None)


async def fail_job(session: AsyncSession, job_id: int, error: str, read: JobInfo | None = None) -> bool:
    """A job in flight -> failed, keeping the error's details (for the log and /admin audit)."""
    return await _move(
        session, job_id, Event.FAILED, *fenced(read), error=error, finished_at=utcnow(), deadline_at=None
    )


async def cancel_job(session: AsyncSession, job_id: int) -> bool:
    """A job in flight -> cancelled, so a result arriving later is never applied.

    One never sent has no workers to tell: it counts as told now, so the supervisor's look for cancels
    to mark (``cancels_to_mark``) never walks the pile of those.
    """
    now = utcnow()
    told = case((Job.sent_at.is_(None), now), else_=Job.cancel_marked_at)
    return await _move(session, job_id, Event.CANCELLED, finished_at=now, deadline_at=None, cancel_marked_at=told)


async def expire_job(session: AsyncSession, job_id: int, read: JobInfo | None = None) -> bool:
    """A queued job nobody picked up in time -> expired."""
    return await _move(
        session,
        job_id,
        Event.EXPIRED,
        *fenced(read),
        error="no worker picked it up in time",
        finished_at=utcnow(),
        deadline_at=None,
    )


async def apply_result(session: AsyncSession, job_id: int, result: TurnResult, clip_key: str | None) -> bool:
    """Apply a finished turn to its character, once per job id; False if nothing was applied.

    The claim comes first: the SUCCEEDED move, also stamping ``applied_at``. Only the caller
    whose UPDATE matched goes on to change the character, so a second delivery of the same
    result, or a result for a job cancelled meanwhile, changes nothing. Claiming before reading
    also means the reads below happen inside the write transaction (SQLite's driver only opens
    one at the first write), so the character is re-read as it is now, under FOR UPDATE where
    the database has it. A mismatched result raises, rolling the claim back.
    """
    now = utcnow()
    rule = MOVES[Event.SUCCEEDED]
    claimed = (
        await session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_(rule.sources), Job.applied_at.is_(None))
            .values(
                status=rule.target,
                progress=1.0,
                step=Job.total,
                finished_at=now,
                applied_at=now,
                started_at=func.coalesce(Job.started_at, now),
                deadline_at=None,
            )
            .returning(Job.turn_id, Job.task_id)
        )
    ).one_or_none()
    if claimed is None:
        log.info("job %s: result not applied (already applied, cancelled, failed or gone)", job_id)
        return False
    turn_id, task_id = claimed
    if result.job_id not in (str(job_id), task_id):
        raise ResultMismatchError(f"result for job {result.job_id!r} handed to job {job_id} ({task_id})")

    turn = (
        await session.execute(select(Turn).where(Turn.id == turn_id).execution_options(populate_existing=True))
    ).scalar_one()
    character = (
        await session.execute(
            select(Character)
            .where(Character.id == turn.character_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    ).scalar_one()

    after = CharacterState(
        stamina=character.stamina, social=character.social, entertainment=character.entertainment
    ).apply(result.deltas)
    character.stamina, character.social, character.entertainment = after.stamina, after.social, after.entertainment

    turn.model = result.model
    turn.d_motion = result.deltas.motion
    turn.d_social = result.deltas.social
    turn.d_entertainment = result.deltas.entertainment
    turn.d_stamina = result.deltas.stamina
    turn.stamina_after, turn.social_after, turn.entertainment_after = after.stamina, after.social, after.entertainment
    turn.flow = result.flow
    turn.representation = inline(result.representation, "the result's representation")  # resolved by the caller
    turn.clip_key = clip_key
    turn.safety = result.safety.model_dump_json()
    turn.timings = json.dumps(result.timings)
    turn.label = result.label[:100]
    await session.flush()
    return True


# --------------------------------------------------------------------------------------------
# Around the moves: messages, cancel marks, posting
# --------------------------------------------------------------------------------------------


async def mark_undeliverable(session: AsyncSession, job_id: int, undeliverable: int) -> bool:
    """Give a post up for good, unless a message was recorded for it meanwhile (by this process or another)."""
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.result_message_id.is_(None))
        .values(result_message_id=undeliverable)
        .returning(Job.id)
    )
    return _changed(result)


async def set_job_messages(
    session: AsyncSession,
    job_id: int,
    *,
    progress_message_id: int | None = None,
    result_message_id: int | None = None,
) -> None:
    """Remember the Discord messages of a job, so a restarted bot edits them instead of reposting."""
    values: dict[str, int] = {}
    if progress_message_id is not None:
        values["progress_message_id"] = progress_message_id
    if result_message_id is not None:
        values["result_message_id"] = result_message_id
    if values:
        await session.execute(update(Job).where(Job.id == job_id).values(**values))


async def record_post(session: AsyncSession, job_id: int, message_id: int) -> bool:
    """Record a finished turn's posted message, once: False when another process (or an earlier try) recorded it,
    so what follows a post (its audit row, a withheld clip's cleanup) happens once however many posted it."""
    done = await session.execute(
        update(Job).where(Job.id == job_id, Job.result_message_id.is_(None)).values(result_message_id=message_id)
    )
    return bool(done.rowcount)


async def withhold_clip(session: AsyncSession, turn_id: int, why: str) -> None:
    """Record that a turn's clip was not posted, and why, and forget its stored clip, its deletion recorded (the
    caller deletes it once this commits). The turn itself, its text and its state, stays: the story goes on."""
    key = (await session.execute(select(Turn.clip_key).where(Turn.id == turn_id))).scalar()
    await session.execute(update(Turn).where(Turn.id == turn_id).values(clip_withheld=why[:300], clip_key=None))
    if key:
        await clip_deletes.record(session, [key])


async def note_cancel_marked(session: AsyncSession, job_id: int) -> None:
    await session.execute(update(Job).where(Job.id == job_id).values(cancel_marked_at=utcnow()))


async def note_post_failure(session: AsyncSession, job_id: int) -> int:
    """Count a failed post of a finished turn; returns how many have failed."""
    result = await session.execute(
        update(Job).where(Job.id == job_id).values(post_attempts=Job.post_attempts + 1).returning(Job.post_attempts)
    )
    return result.scalar_one()


# --------------------------------------------------------------------------------------------
# Reading jobs back
# --------------------------------------------------------------------------------------------


def _job_info_select() -> Any:
    return select(
        Job.id,
        Job.task_id,
        Job.kind,
        Job.status,
        Job.turn_id,
        Turn.character_id,
        Turn.story_id,
        Turn.seq,
        Turn.instruction,
        Turn.model_key,
        Job.progress,
        Job.step,
        Job.total,
        Job.guild_id,
        Job.channel_id,
        Job.user_id,
        Job.progress_message_id,
        Job.result_message_id,
        Job.queued_at,
        Job.started_at,
        Job.sent_at,
        Job.attempts,
        Job.deadline_at,
        Job.post_attempts,
    ).join(Turn, Job.turn_id == Turn.id)


def _job_info(row: Sequence[Any]) -> JobInfo:
    return JobInfo(*row)


async def get_job(session: AsyncSession, job_id: int) -> JobInfo | None:
    row = (await session.execute(_job_info_select().where(Job.id == job_id))).one_or_none()
    return None if row is None else _job_info(row)


async def jobs_in_flight(session: AsyncSession) -> list[JobInfo]:
    """Every queued or running job, oldest first: what the supervisor watches, also after a restart."""
    stmt = _job_info_select().where(status_in(*IN_FLIGHT)).order_by(Job.id)
    return [_job_info(row) for row in await session.execute(stmt)]


def waits_for_story() -> ColumnElement[bool]:
    """A story turn waits while an earlier turn of its story is still in flight (its history is not made yet)."""
    earlier_turn, earlier_job = aliased(Turn), aliased(Job)
    return exists(
        select(earlier_job.id)
        .join(earlier_turn, earlier_job.turn_id == earlier_turn.id)
        .where(
            earlier_turn.story_id == Turn.story_id,
            earlier_turn.seq < Turn.seq,
            status_in(*IN_FLIGHT, column=earlier_job.status),
        )
    )


async def jobs_to_send(session: AsyncSession, only: int | None = None) -> list[JobInfo]:
    """The outbox: committed jobs whose task is not with the broker, and that may go now (``only``: that job)."""
    stmt = (
        _job_info_select()
        .where(
            Job.status == JobStatus.QUEUED, Job.sent_at.is_(None), ~and_(Turn.story_id.is_not(None), waits_for_story())
        )
        .order_by(Job.id)
    )
    if only is not None:
        stmt = stmt.where(Job.id == only)
    return [_job_info(row) for row in await session.execute(stmt)]


async def cancels_to_mark(session: AsyncSession) -> list[JobInfo]:
    """Cancelled jobs that were sent but whose workers have not been told yet (the store was down)."""
    waiting = select(Job.id).where(status_in(JobStatus.CANCELLED), Job.cancel_marked_at.is_(None))
    return await _few_jobs(session, waiting, Job.sent_at.is_not(None))


async def jobs_to_post(session: AsyncSession) -> list[JobInfo]:
    """Jobs applied but not yet posted: the delivery posts these, also after a restart."""
    waiting = select(Job.id).where(status_in(JobStatus.DONE), Job.result_message_id.is_(None))
    return await _few_jobs(session, waiting, Job.applied_at.is_not(None), Job.channel_id.is_not(None))


async def _few_jobs(session: AsyncSession, ids: Select[Any], *more: ColumnElement[bool]) -> list[JobInfo]:
    """The few jobs ``ids`` finds among all those ever made, found on the jobs table alone first.

    Two round trips, not one join: PostgreSQL takes the two conditions (finished, not yet posted) as
    independent and guessed thousands of rows for the few dozen there are, then read all of turns
    to join them, each tick. Alone, the ids come from the index only; then the rows, by id.
    """
    found = list((await session.execute(ids)).scalars())
    if not found:
        return []
    stmt = _job_info_select().where(Job.id.in_(found), *more).order_by(Job.id)
    return [_job_info(row) for row in await session.execute(stmt)]


async def earlier_story_turns_unposted(session: AsyncSession, story_id: int, seq: int) -> bool:
    """Whether a story turn before ``seq`` will still be posted: its posts keep the story's order."""
    stmt = (
        select(Job.id)
        .join(Turn, Job.turn_id == Turn.id)
        .where(
            Turn.story_id == story_id,
            Turn.seq < seq,
            status_in(*IN_FLIGHT) | (status_in(JobStatus.DONE) & Job.result_message_id.is_(None)),
        )
        .limit(1)
    )
    return (await session.execute(stmt)).first() is not None


async def user_jobs_in_flight(session: AsyncSession, guild_id: int, user_id: int) -> list[JobInfo]:
    stmt = (
        _job_info_select()
        .where(Job.guild_id == guild_id, Job.user_id == user_id, status_in(*IN_FLIGHT))
        .order_by(Job.id)
    )
    return [_job_info(row) for row in await session.execute(stmt)]


async def player_has_turn_in_flight(session: AsyncSession, guild_id: int, user_id: int) -> bool:
    """Whether the player has a queued or running turn, whichever character played it (one at a time)."""
    stmt = select(Job.id).where(Job.guild_id == guild_id, Job.user_id == user_id, status_in(*IN_FLIGHT)).limit(1)
    return (await session.execute(stmt)).first() is not None


async def has_turn_in_flight(session: AsyncSession, character: Character | int) -> bool:
    """Whether the character already has a queued or running turn (one at a time per player)."""
    stmt = (
        select(Job.id)
        .join(Turn, Job.turn_id == Turn.id)
        .where(Turn.character_id == _id(character), status_in(*IN_FLIGHT))
        .limit(1)
    )
    return (await session.execute(stmt)).first() is not None


async def queue_position(session: AsyncSession, job_id: int) -> int | None:
    """How many turns reach a worker before this one (0: next); None once it is no longer queued.

    A turn already at the broker waits behind the ones sent before it. One still in the bot's
    backlog waits for ``game.schedule``'s fair rule: its estimate counts every turn at the broker,
    then a round of every other waiting server for each turn of its own server ahead of it.
    """
    row = (await session.execute(select(Job.status, Job.sent_at, Job.guild_id).where(Job.id == job_id))).one_or_none()
    if row is None or row.status != JobStatus.QUEUED:
        return None
    queued, sent = Job.status == JobStatus.QUEUED, Job.sent_at.is_not(None)
    if row.sent_at is not None:
        stmt = select(func.count()).select_from(Job).where(queued, sent, Job.id < job_id)
        return (await session.execute(stmt)).scalar_one()
    mine = Job.guild_id.is_(None) if row.guild_id is None else Job.guild_id == row.guild_id
    at_broker, mine_before, others = (
        await session.execute(
            select(
                func.count().filter(sent),
                func.count().filter(~sent, mine, Job.id < job_id),
                func.count(func.distinct(Job.guild_id)).filter(~sent, ~mine),
            ).where(queued)
        )
    ).one()
    return turns_ahead(at_broker, mine_before, others)


async def seconds_between_turns(session: AsyncSession, default: float) -> float:
    """How often a turn finishes while turns are waiting: the mean gap between the last 20 finishes of the
    past 10 minutes (``default`` with fewer than two). Each turn ahead in the queue adds one gap to an ETA.

    A turn's own start-to-done time says nothing about this gap: it leaves out the time between turns, and
    several workers finish turns in parallel. Under a burst of short turns the supervisor often sees a turn
    start and end in the same tick, and ETAs built on it were so short that turns expired while waiting.
    """
    stmt = (
        select(Job.finished_at)
        .where(Job.status == JobStatus.DONE, Job.finished_at >= utcnow() - timedelta(minutes=10))
        .order_by(Job.finished_at.desc())
        .limit(20)
    )
    finished = [row for row in (await session.execute(stmt)).scalars() if row is not None]
    if len(finished) < 2:
        return default
    return max((finished[0] - finished[-1]).total_seconds() / (len(finished) - 1), 0.01)


async def average_turn_seconds(session: AsyncSession, default: float) -> float:
    """Mean start-to-done time of the last 20 turns, for the ETA shown to players."""
    stmt = (
        select(Job.started_at, Job.finished_at)
        .where(Job.status == JobStatus.DONE, Job.started_at.is_not(None), Job.finished_at.is_not(None))
        .order_by(Job.id.desc())
        .limit(20)
    )
    rows = (await session.execute(stmt)).all()
    return sum((f - s).total_seconds() for s, f in rows) / len(rows) if rows else default


async def turn_of_job(session: AsyncSession, job_id: int) -> tuple[Job, Turn, Character | None] | None:
    """A job, its turn and the character who played it (None for a turn its player started over from)."""
    stmt = (
        select(Job, Turn, Character)
        .join(Turn, Job.turn_id == Turn.id)
        .outerjoin(Character, Turn.character_id == Character.id)
        .where(Job.id == job_id)
    )
    row = (await session.execute(stmt)).one_or_none()
    return None if row is None else (row[0], row[1], row[2])


# --------------------------------------------------------------------------------------------
# History: the past turns a prompt carries
# --------------------------------------------------------------------------------------------


async def build_history(
    session: AsyncSession, source: Character | Story, window: int, model_key: str | None = None
) -> list[HistoryTurn]:
    """The past completed turns the next prompt sees, oldest first (window N: N - 1 of them).

    For a story these are the story's turns, whoever played them, in ``seq`` order; for a
    character, its own turns in the order they were made. Turns still in flight, failed or
    cancelled have no representation and never count. With ``model_key``, only turns whose
    representation the same weights made: a representation from another character's MLLM
    means nothing to this one.
    """
    completed = Turn.stamina_after.is_not(None) & Turn.representation.is_not(None)
    if model_key is not None:
        completed = completed & (Turn.model_key == model_key)
    if isinstance(source, Story):
        stmt = select(Turn).where(Turn.story_id == source.id, completed).order_by(Turn.seq.desc())
    elif isinstance(source, Character):
        stmt = select(Turn).where(Turn.character_id == source.id, completed).order_by(Turn.id.desc())
    else:
        raise TypeError(f"build_history takes a Character or a Story, not {type(source).__name__}")
    # At most MAX_WINDOW - 1 turns can ever be used; game.history decides how many of them are.
    stmt = stmt.options(undefer(Turn.representation))  # the one place a turn's representation is read
    newest = list((await session.execute(stmt.limit(MAX_WINDOW - 1))).scalars())
    return [history_turn(t) for t in past_turns_for(newest[::-1], window)]


def turn_outcome(turn: Turn) -> tuple[CharacterState, StateDeltas]:
    """What a finished turn did: the character's state after it and the changes, as the clip's card and the story
    page show them."""
    assert turn.stamina_after is not None and turn.social_after is not None
    assert turn.entertainment_after is not None
    state = CharacterState(stamina=turn.stamina_after, social=turn.social_after, entertainment=turn.entertainment_after)
    deltas = StateDeltas(
        motion=turn.d_motion or 0,
        social=turn.d_social or 0,
        entertainment=turn.d_entertainment or 0,
        stamina=turn.d_stamina or 0,
    )
    return state, deltas


def history_turn(turn: Turn) -> HistoryTurn:
    """A completed turn as a prompt's history carries it."""
    assert turn.representation is not None
    return HistoryTurn(
        instruction=turn.instruction,
        representation=turn.representation,
        deltas=StateDeltas(
            motion=turn.d_motion,
            social=turn.d_social,
            entertainment=turn.d_entertainment,
            stamina=turn.d_stamina,
        ),
    )


# --------------------------------------------------------------------------------------------


def _id(obj: Any) -> int:
    return obj if isinstance(obj, int) else obj.id


def _changed(result: Any) -> bool:
    # RETURNING rather than rowcount: SQLite's driver reports rowcount for UPDATE ... RETURNING
    # only after the rows are fetched, and both backends support RETURNING.
    return result.scalar_one_or_none() is not None
