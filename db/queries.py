"""The queries the bot and the CLI need, each one ``async def f(session, ...)``.

The caller owns the transaction (``async with Session() as s, s.begin():``) and so decides what
is one unit of work; nothing here commits. Functions that change a job's status do it with one
conditional UPDATE (``... WHERE status IN (queued, running)``), so a cancel racing a result, or
two delivery loops racing each other, resolve in the database rather than in Python: whichever
UPDATE lands first wins and the other sees zero rows.

Functions that look things up for the caller to show or to send return plain frozen dataclasses
(``JobInfo``); functions that create rows return the ORM objects, which the caller may use
inside the same session.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase

from db.base import utcnow
from db.models import (
    IN_FLIGHT,
    AppState,
    Character,
    Guild,
    GuildSettings,
    Job,
    JobKind,
    JobStatus,
    Player,
    Story,
    StoryMember,
    StoryStatus,
    Turn,
    TurnOrder,
    new_task_id,
)
from game.contract import HistoryTurn, TurnResult
from game.history import MAX_WINDOW, past_turns_for
from game.instruction import MAX_FIELD_CHARS
from game.state import CharacterState, StateDeltas

log = logging.getLogger(__name__)

SEED_LIMIT = 2**63  # seeds are stored in a signed BIGINT (and the contract says < 2**63)


class StoryClosedError(ValueError):
    """A turn or a member was added to a story that is archived (or gone)."""

    def __init__(self, story_id: int) -> None:
        super().__init__(story_id)
        self.story_id = story_id

    def __str__(self) -> str:
        return f"story {self.story_id} is not active; start a new one with /story start"


class ResultMismatchError(ValueError):
    """A TurnResult was handed to a job it does not belong to: a delivery bug, never data."""


@dataclass(frozen=True)
class JobInfo:
    """A job as the delivery loop and the progress message need it; safe outside the session."""

    id: int
    task_id: str
    kind: JobKind
    status: JobStatus
    turn_id: int
    character_id: int
    story_id: int | None
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


# --------------------------------------------------------------------------------------------
# Guilds, players, characters
# --------------------------------------------------------------------------------------------


async def insert_ignore(session: AsyncSession, model: type[DeclarativeBase], **values: Any) -> None:
    """INSERT that does nothing when the row exists, so concurrent first uses do not collide.

    A SELECT-then-INSERT would let two commands for a new guild both insert and one fail.
    """
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        stmt = sqlite.insert(model).values(**values).on_conflict_do_nothing()
    elif dialect == "postgresql":
        stmt = postgresql.insert(model).values(**values).on_conflict_do_nothing()
    else:  # pragma: no cover - only SQLite and PostgreSQL are supported
        raise NotImplementedError(f"no insert-or-ignore for {dialect}")
    await session.execute(stmt)


async def get_or_create_guild(session: AsyncSession, guild_id: int, name: str | None = None) -> Guild:
    """The guild's row, created with its settings row (column defaults) on first use."""
    await insert_ignore(session, Guild, id=guild_id, name=name or "")
    await insert_ignore(session, GuildSettings, guild_id=guild_id)
    guild = (await session.execute(select(Guild).where(Guild.id == guild_id))).scalar_one()
    if name is not None and guild.name != name:
        guild.name = name  # guilds get renamed; keep what admins see in the audit log current
    return guild


async def get_guild_settings(session: AsyncSession, guild_id: int) -> GuildSettings:
    """The guild's settings in one read (created with defaults if the guild is new)."""
    await get_or_create_guild(session, guild_id)
    return (await session.execute(select(GuildSettings).where(GuildSettings.guild_id == guild_id))).scalar_one()


async def get_or_create_player(session: AsyncSession, guild_id: int, user_id: int) -> Player:
    await get_or_create_guild(session, guild_id)
    await insert_ignore(session, Player, guild_id=guild_id, user_id=user_id)
    stmt = select(Player).where(Player.guild_id == guild_id, Player.user_id == user_id)
    return (await session.execute(stmt)).scalar_one()


async def get_or_create_character(session: AsyncSession, guild_id: int, user_id: int, name: str) -> Character:
    """The player's character called ``name`` (created at the starting stats if new), now active.

    A player plays one character at a time (a partial unique index enforces it), so the others
    are switched off first, in their own statement, before this one is switched on.
    """
    name = name.strip()
    if not name or len(name) > MAX_FIELD_CHARS:
        raise ValueError(f"a character name must be 1..{MAX_FIELD_CHARS} characters, got {len(name)}")
    player = await get_or_create_player(session, guild_id, user_id)
    await session.execute(
        update(Character)
        .where(Character.player_id == player.id, Character.name != name, Character.is_active.is_(True))
        .values(is_active=False)
    )
    await insert_ignore(session, Character, player_id=player.id, name=name, is_active=False)
    stmt = select(Character).where(Character.player_id == player.id, Character.name == name)
    # populate_existing: the UPDATE above bypassed any copies already in the identity map.
    character = (await session.execute(stmt.execution_options(populate_existing=True))).scalar_one()
    character.is_active = True
    await session.flush()
    return character


async def active_character(session: AsyncSession, guild_id: int, user_id: int) -> Character | None:
    stmt = (
        select(Character)
        .join(Player, Character.player_id == Player.id)
        .where(Player.guild_id == guild_id, Player.user_id == user_id, Character.is_active.is_(True))
    )
    return (await session.execute(stmt)).scalar_one_or_none()


# --------------------------------------------------------------------------------------------
# Stories
# --------------------------------------------------------------------------------------------


async def create_story(
    session: AsyncSession,
    guild_id: int,
    channel_id: int,
    title: str,
    created_by: int,
    turn_order: TurnOrder = TurnOrder.FREE,
) -> Story:
    """A new active story; raises ``IntegrityError`` if the channel already has one."""
    await get_or_create_guild(session, guild_id)
    story = Story(
        guild_id=guild_id, channel_id=channel_id, title=title, created_by=created_by, turn_order=TurnOrder(turn_order)
    )
    session.add(story)
    await session.flush()
    return story


async def active_story(session: AsyncSession, channel_id: int) -> Story | None:
    stmt = select(Story).where(Story.channel_id == channel_id, Story.status == StoryStatus.ACTIVE)
    return (await session.execute(stmt)).scalar_one_or_none()


async def join_story(session: AsyncSession, story: Story | int, character: Character | int) -> StoryMember:
    """Add a character to a story (or bring back one who left), last in the round-robin order."""
    story_id = _id(story)
    character_id = _id(character)
    status = (await session.execute(select(Story.status).where(Story.id == story_id))).scalar_one_or_none()
    if status != StoryStatus.ACTIVE:
        raise StoryClosedError(story_id)
    stmt = select(StoryMember).where(StoryMember.story_id == story_id, StoryMember.character_id == character_id)
    member = (await session.execute(stmt)).scalar_one_or_none()
    next_position = (
        await session.execute(
            select(func.coalesce(func.max(StoryMember.position) + 1, 0)).where(StoryMember.story_id == story_id)
        )
    ).scalar_one()
    if member is None:
        member = StoryMember(story_id=story_id, character_id=character_id, position=next_position)
        session.add(member)
    elif member.left_at is not None:
        member.left_at = None
        member.position = next_position
    await session.flush()
    return member


async def end_story(session: AsyncSession, story: Story | int) -> bool:
    """Archive a story (which frees its channel for a new one); False if it was not active."""
    result = await session.execute(
        update(Story)
        .where(Story.id == _id(story), Story.status == StoryStatus.ACTIVE)
        .values(status=StoryStatus.ARCHIVED, ended_at=utcnow())
        .returning(Story.id)
    )
    return _changed(result)


# --------------------------------------------------------------------------------------------
# Turns and jobs
# --------------------------------------------------------------------------------------------


async def create_turn(
    session: AsyncSession,
    character: Character | int,
    instruction: str,
    seed: int,
    model: str,
    *,
    story: Story | int | None = None,
    kind: JobKind | str | None = None,
    guild_id: int | None = None,
    channel_id: int | None = None,
    user_id: int | None = None,
    task_id: str | None = None,
) -> tuple[Turn, Job]:
    """A queued turn and its job. The caller commits, then sends the task (never before).

    In a story the turn takes the story's next ``seq``: bumping ``stories.last_seq`` with an
    UPDATE takes the write lock first, so two players acting at once get 1 and 2, not 1 and 1.
    ``kind`` defaults to ``story`` for a story turn and ``act`` otherwise.
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
        character_id=_id(character), story_id=story_id, seq=seq, instruction=instruction, seed=seed, model=model
    )
    job = Job(
        turn=turn,
        task_id=task_id or new_task_id(),
        kind=job_kind,
        guild_id=guild_id,
        channel_id=channel_id,
        user_id=user_id,
    )
    session.add_all([turn, job])
    await session.flush()
    return turn, job


async def build_history(session: AsyncSession, source: Character | Story, window: int) -> list[HistoryTurn]:
    """The past completed turns the next prompt sees, oldest first (window N: N - 1 of them).

    For a story these are the story's turns, whoever played them, in ``seq`` order; for a
    character, its own turns in the order they were made. Turns still in flight, failed or
    cancelled have no representation and never count.
    """
    completed = Turn.stamina_after.is_not(None) & Turn.representation.is_not(None)
    if isinstance(source, Story):
        stmt = select(Turn).where(Turn.story_id == source.id, completed).order_by(Turn.seq.desc())
    elif isinstance(source, Character):
        stmt = select(Turn).where(Turn.character_id == source.id, completed).order_by(Turn.id.desc())
    else:
        raise TypeError(f"build_history takes a Character or a Story, not {type(source).__name__}")
    # At most MAX_WINDOW - 1 turns can ever be used; game.history decides how many of them are.
    newest = list((await session.execute(stmt.limit(MAX_WINDOW - 1))).scalars())
    return [_history_turn(t) for t in past_turns_for(newest[::-1], window)]


def _history_turn(turn: Turn) -> HistoryTurn:
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


async def get_job(session: AsyncSession, job_id: int) -> JobInfo | None:
    stmt = _job_info_select().where(Job.id == job_id)
    row = (await session.execute(stmt)).one_or_none()
    return None if row is None else _job_info(row)


async def jobs_in_flight(session: AsyncSession) -> list[JobInfo]:
    """Every queued or running job, oldest first: what the delivery loop watches and resumes."""
    stmt = _job_info_select().where(Job.status.in_(IN_FLIGHT)).order_by(Job.id)
    return [_job_info(row) for row in await session.execute(stmt)]


async def has_turn_in_flight(session: AsyncSession, character: Character | int) -> bool:
    """Whether the character already has a queued or running turn (one at a time per player)."""
    stmt = (
        select(Job.id)
        .join(Turn, Job.turn_id == Turn.id)
        .where(Turn.character_id == _id(character), Job.status.in_(IN_FLIGHT))
        .limit(1)
    )
    return (await session.execute(stmt)).first() is not None


async def queue_position(session: AsyncSession, job_id: int) -> int | None:
    """How many queued jobs are ahead of this one (0: next); None once it is no longer queued."""
    status = (await session.execute(select(Job.status).where(Job.id == job_id))).scalar_one_or_none()
    if status != JobStatus.QUEUED:
        return None
    stmt = select(func.count()).select_from(Job).where(Job.status == JobStatus.QUEUED, Job.id < job_id)
    return (await session.execute(stmt)).scalar_one()


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


async def mark_job_running(session: AsyncSession, job_id: int) -> bool:
    """queued -> running; False if the job is not queued any more (cancelled, already running)."""
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.RUNNING, started_at=utcnow())
        .returning(Job.id)
    )
    return _changed(result)


async def update_job_progress(session: AsyncSession, job_id: int, step: int, total: int) -> bool:
    """Record step/total of a job in flight (marking it running); False once it has finished."""
    if total <= 0 or step < 0:
        raise ValueError(f"progress needs 0 <= step and 0 < total, got {step}/{total}")
    step = min(step, total)
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(IN_FLIGHT))
        .values(
            status=JobStatus.RUNNING,
            step=step,
            total=total,
            progress=step / total,
            started_at=func.coalesce(Job.started_at, utcnow()),
        )
        .returning(Job.id)
    )
    return _changed(result)


async def fail_job(session: AsyncSession, job_id: int, error: str) -> bool:
    """A job in flight -> failed, keeping the error text; False if it had already finished."""
    return await _finish(session, job_id, JobStatus.FAILED, error=error)


async def cancel_job(session: AsyncSession, job_id: int) -> bool:
    """A job in flight -> cancelled, so a result arriving later is not applied."""
    return await _finish(session, job_id, JobStatus.CANCELLED)


async def _finish(session: AsyncSession, job_id: int, status: JobStatus, error: str | None = None) -> bool:
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(IN_FLIGHT))
        .values(status=status, error=error, finished_at=utcnow())
        .returning(Job.id)
    )
    return _changed(result)


async def apply_result(session: AsyncSession, job_id: int, result: TurnResult, clip_path: str | None) -> bool:
    """Apply a finished turn to its character, once per job id; False if nothing was applied.

    The claim comes first: one UPDATE moves the job from in flight to done and stamps
    ``applied_at``. Only the caller whose UPDATE matched goes on to change the character, so a
    second delivery of the same result, or a result for a job cancelled meanwhile, changes
    nothing. Claiming before reading also means the reads below happen inside the write
    transaction (SQLite's driver only opens one at the first write), so the character is
    re-read as it is now, under FOR UPDATE where the database has it: another turn may have
    changed it after this job was queued. A mismatched result raises, rolling the claim back.
    """
    now = utcnow()
    claimed = (
        await session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_(IN_FLIGHT), Job.applied_at.is_(None))
            .values(
                status=JobStatus.DONE,
                progress=1.0,
                step=Job.total,
                finished_at=now,
                applied_at=now,
                started_at=func.coalesce(Job.started_at, now),
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
    turn.representation = result.representation
    turn.clip_path = clip_path
    turn.timings = json.dumps(result.timings)
    await session.flush()
    return True


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _id(obj: Any) -> int:
    return obj if isinstance(obj, int) else obj.id


def _changed(result: Any) -> bool:
    # RETURNING rather than rowcount: SQLite's driver reports rowcount for UPDATE ... RETURNING
    # only after the rows are fetched, and both backends support RETURNING.
    return result.scalar_one_or_none() is not None


def _job_info_select() -> Any:
    return select(
        Job.id,
        Job.task_id,
        Job.kind,
        Job.status,
        Job.turn_id,
        Turn.character_id,
        Turn.story_id,
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
    ).join(Turn, Job.turn_id == Turn.id)


def _job_info(row: Sequence[Any]) -> JobInfo:
    return JobInfo(*row)


# --------------------------------------------------------------------------------------------
# What the bot shows and resumes
# --------------------------------------------------------------------------------------------


async def jobs_to_post(session: AsyncSession) -> list[JobInfo]:
    """Jobs applied but not yet posted: the delivery loop posts these, also after a restart."""
    stmt = (
        _job_info_select()
        .where(Job.status == JobStatus.DONE, Job.applied_at.is_not(None), Job.result_message_id.is_(None))
        .where(Job.channel_id.is_not(None))
        .order_by(Job.id)
    )
    return [_job_info(row) for row in await session.execute(stmt)]


async def user_jobs_in_flight(session: AsyncSession, guild_id: int, user_id: int) -> list[JobInfo]:
    stmt = (
        _job_info_select()
        .where(Job.guild_id == guild_id, Job.user_id == user_id, Job.status.in_(IN_FLIGHT))
        .order_by(Job.id)
    )
    return [_job_info(row) for row in await session.execute(stmt)]


async def recent_turns(session: AsyncSession, character_id: int, limit: int = 10) -> list[Turn]:
    """The character's latest completed turns, newest first."""
    stmt = (
        select(Turn)
        .where(Turn.character_id == character_id, Turn.stamina_after.is_not(None))
        .order_by(Turn.id.desc())
        .limit(limit)
    )
    return list((await session.execute(stmt)).scalars())


async def story_turns(session: AsyncSession, story_id: int) -> list[tuple[Turn, str]]:
    """A story's completed turns in order, each with the name of the character who played it."""
    stmt = (
        select(Turn, Character.name)
        .join(Character, Turn.character_id == Character.id)
        .where(Turn.story_id == story_id, Turn.stamina_after.is_not(None))
        .order_by(Turn.seq)
    )
    return [(turn, name) for turn, name in (await session.execute(stmt)).all()]


async def average_turn_seconds(session: AsyncSession, default: float) -> float:
    """Mean queue-to-done time of the last 20 turns, for the ETA shown to players."""
    stmt = (
        select(Job.started_at, Job.finished_at)
        .where(Job.status == JobStatus.DONE, Job.started_at.is_not(None), Job.finished_at.is_not(None))
        .order_by(Job.id.desc())
        .limit(20)
    )
    rows = (await session.execute(stmt)).all()
    return sum((f - s).total_seconds() for s, f in rows) / len(rows) if rows else default


async def reset_character(session: AsyncSession, character: Character) -> None:
    """Start over: back to the starting stats, and the character's past turns forgotten."""
    await session.execute(delete(Turn).where(Turn.character_id == character.id))
    character.stamina = character.social = character.entertainment = CharacterState().stamina
    await session.flush()


async def member_of_story(session: AsyncSession, story_id: int, character_id: int) -> StoryMember | None:
    stmt = select(StoryMember).where(
        StoryMember.story_id == story_id, StoryMember.character_id == character_id, StoryMember.left_at.is_(None)
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def leave_story(session: AsyncSession, story_id: int, character_id: int) -> bool:
    member = await member_of_story(session, story_id, character_id)
    if member is None:
        return False
    member.left_at = utcnow()
    await session.flush()
    return True


async def next_in_turn(session: AsyncSession, story: Story) -> int | None:
    """Round robin: the character whose turn it is (after the last turn's player, by joining order)."""
    members = list(
        (
            await session.execute(
                select(StoryMember)
                .where(StoryMember.story_id == story.id, StoryMember.left_at.is_(None))
                .order_by(StoryMember.position)
            )
        ).scalars()
    )
    if not members:
        return None
    last = (
        await session.execute(
            select(Turn.character_id).where(Turn.story_id == story.id).order_by(Turn.seq.desc()).limit(1)
        )
    ).scalar_one_or_none()
    order = [m.character_id for m in members]
    if last not in order:
        return order[0]
    return order[(order.index(last) + 1) % len(order)]


async def turn_of_job(session: AsyncSession, job_id: int) -> tuple[Job, Turn, Character] | None:
    stmt = (
        select(Job, Turn, Character)
        .join(Turn, Job.turn_id == Turn.id)
        .join(Character, Turn.character_id == Character.id)
        .where(Job.id == job_id)
    )
    row = (await session.execute(stmt)).one_or_none()
    return None if row is None else (row[0], row[1], row[2])


async def get_app_state(session: AsyncSession, key: str) -> str | None:
    return (await session.execute(select(AppState.value).where(AppState.key == key))).scalar_one_or_none()


async def set_app_state(session: AsyncSession, key: str, value: str) -> None:
    row = (await session.execute(select(AppState).where(AppState.key == key))).scalar_one_or_none()
    if row is None:
        session.add(AppState(key=key, value=value))
    else:
        row.value = value
    await session.flush()
