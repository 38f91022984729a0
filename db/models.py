"""The tables: what the game keeps between turns and what the Discord bot keeps between restarts.

Column defaults here are the only place a default lives (a guild's settings, a character's
starting stats); commands and queries never repeat them. Each default is given both to Python
(so a new object reads it before the flush) and to the database (so rows written by a
revision or by hand get it too).

Enumerations are stored as short strings with a CHECK constraint rather than native enum
types, so SQLite and PostgreSQL hold the same schema and a new value is a plain revision.
"""

from __future__ import annotations

import enum
import uuid

from sqlalchemy import (
    CheckConstraint,
    Enum,
    Float,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from db.base import Base, CreatedAt, IntPK, Snowflake, Timestamp
from game.history import DEFAULT_WINDOW, MAX_WINDOW
from game.instruction import MAX_FIELD_CHARS, MAX_LINE_CHARS
from game.jobs import IN_FLIGHT, JobStatus  # a job's states are game rules; the table stores them
from game.safety import SafetyPolicy
from game.state import DELTA_MAX, DELTA_MIN, STAT_MAX, STAT_MIN, STAT_START

# Guild settings defaults (the single place they live).
DEFAULT_PAUSED = False
DEFAULT_TURNS_PER_HOUR = 20
DEFAULT_MAX_QUEUED_TURNS = 10
DEFAULT_HISTORY_WINDOW = DEFAULT_WINDOW
DEFAULT_SAFETY_POLICY = SafetyPolicy.WITHHOLD  # a flagged clip is posted nowhere until an admin says otherwise


def status_sql(*statuses: JobStatus) -> str:
    """``status IN ('queued', 'running')``: a partial index's WHERE, written with the values themselves.

    A query uses a partial index only when its own WHERE spells the same condition; a bound
    parameter (``status IN (?, ?)``) proves nothing to SQLite's planner (nor to PostgreSQL's
    generic plans), so the queries that need these indexes write the values too (``db.jobs``).
    """
    return "status IN (" + ", ".join(f"'{s.value}'" for s in statuses) + ")"


IN_FLIGHT_SQL = status_sql(*IN_FLIGHT)


class StoryStatus(enum.StrEnum):
    ACTIVE = "active"
    ARCHIVED = "archived"


class TurnOrder(enum.StrEnum):
    FREE = "free"
    ROUND_ROBIN = "round_robin"
    VOTE = "vote"  # the channel proposes and votes; each round's winner is played (StoryRound)


class RoundStatus(enum.StrEnum):
    OPEN = "open"  # taking proposals and votes until closes_at
    CLOSED = "closed"  # its winner's turn is made (turn_id), or it had none to play


class JobKind(enum.StrEnum):
    ACT = "act"
    REROLL = "reroll"
    STORY = "story"


def _str_enum(cls: type[enum.StrEnum], name: str) -> Enum:
    """A VARCHAR + CHECK enum holding the members' values (not their Python names).

    ``name`` only names the CHECK constraint (``ck_<table>_<name>``); pass the column's name.
    """
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


def _range_checks(*columns: str, low: int = STAT_MIN, high: int = STAT_MAX) -> list[CheckConstraint]:
    # ``name`` is the %(constraint_name)s part; the convention prefixes ck_<table>_.
    return [CheckConstraint(f"{c} IS NULL OR ({c} BETWEEN {low} AND {high})", name=f"{c}_range") for c in columns]


# --------------------------------------------------------------------------------------------
# Guilds and their settings
# --------------------------------------------------------------------------------------------


class Guild(Base):
    __tablename__ = "guilds"

    id: Mapped[Snowflake] = mapped_column(primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(100), default="")
    created_at: Mapped[CreatedAt]

    settings: Mapped[GuildSettings] = relationship(
        back_populates="guild",
        cascade="save-update, merge, delete, delete-orphan",
        passive_deletes=True,
        lazy="raise",
    )
    players: Mapped[list[Player]] = relationship(
        back_populates="guild",
        cascade="save-update, merge, delete, delete-orphan",
        passive_deletes=True,
        lazy="raise",
    )
    stories: Mapped[list[Story]] = relationship(
        back_populates="guild",
        cascade="save-update, merge, delete, delete-orphan",
        passive_deletes=True,
        lazy="raise",
    )


class GuildSettings(Base):
    """One row per guild, created with the guild; the admin settings commands edit it."""

    __tablename__ = "guild_settings"
    __table_args__ = (
        CheckConstraint("turns_per_hour >= 0", name="turns_per_hour_range"),
        CheckConstraint("max_queued_turns >= 0", name="max_queued_turns_range"),
        CheckConstraint(f"history_window BETWEEN 1 AND {MAX_WINDOW}", name="history_window_range"),
        CheckConstraint("safety_threshold > 0 AND safety_threshold <= 1", name="safety_threshold_range"),
    )

    guild_id: Mapped[Snowflake] = mapped_column(
        ForeignKey("guilds.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    paused: Mapped[bool] = mapped_column(default=DEFAULT_PAUSED, server_default=false())
    turns_per_hour: Mapped[int] = mapped_column(
        default=DEFAULT_TURNS_PER_HOUR, server_default=text(str(DEFAULT_TURNS_PER_HOUR))
    )
    max_queued_turns: Mapped[int] = mapped_column(
        default=DEFAULT_MAX_QUEUED_TURNS, server_default=text(str(DEFAULT_MAX_QUEUED_TURNS))
    )
    history_window: Mapped[int] = mapped_column(
        default=DEFAULT_HISTORY_WINDOW, server_default=text(str(DEFAULT_HISTORY_WINDOW))
    )
    # What a clip the detector flags gets (game.safety); the threshold that flags one, NULL: the operator's
    # ANIMEGAMER_SAFETY_THRESHOLD (revision 0009).
    safety_policy: Mapped[SafetyPolicy] = mapped_column(
        _str_enum(SafetyPolicy, "safety_policy"),
        default=DEFAULT_SAFETY_POLICY,
        server_default=DEFAULT_SAFETY_POLICY.value,
    )
    safety_threshold: Mapped[float | None] = mapped_column(Float)

    guild: Mapped[Guild] = relationship(back_populates="settings", lazy="raise_on_sql")


class AllowedChannel(Base):
    """Channels where play is allowed; a guild with none allows every channel."""

    __tablename__ = "allowed_channels"

    guild_id: Mapped[Snowflake] = mapped_column(ForeignKey("guilds.id", ondelete="CASCADE"), primary_key=True)
    channel_id: Mapped[Snowflake] = mapped_column(primary_key=True)


# --------------------------------------------------------------------------------------------
# Players and characters
# --------------------------------------------------------------------------------------------


class Player(Base):
    __tablename__ = "players"
    __table_args__ = (UniqueConstraint("guild_id", "user_id"),)

    id: Mapped[IntPK]
    guild_id: Mapped[Snowflake] = mapped_column(ForeignKey("guilds.id", ondelete="CASCADE"))
    user_id: Mapped[Snowflake]
    created_at: Mapped[CreatedAt]

    guild: Mapped[Guild] = relationship(back_populates="players", lazy="raise_on_sql")
    characters: Mapped[list[Character]] = relationship(
        back_populates="player",
        cascade="save-update, merge, delete, delete-orphan",
        passive_deletes=True,
        lazy="raise",
    )


class Character(Base):
    __tablename__ = "characters"
    __table_args__ = (
        UniqueConstraint("player_id", "name"),
        *_range_checks("stamina", "social", "entertainment"),
        # A player plays one character at a time; the index makes a second active one impossible.
        Index(
            "uq_characters_one_active_per_player",
            "player_id",
            unique=True,
            sqlite_where=text("is_active"),
            postgresql_where=text("is_active"),
        ),
    )

    id: Mapped[IntPK]
    player_id: Mapped[int] = mapped_column(ForeignKey("players.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(MAX_FIELD_CHARS))
    stamina: Mapped[int] = mapped_column(default=STAT_START, server_default=text(str(STAT_START)))
    social: Mapped[int] = mapped_column(default=STAT_START, server_default=text(str(STAT_START)))
    entertainment: Mapped[int] = mapped_column(default=STAT_START, server_default=text(str(STAT_START)))
    is_active: Mapped[bool] = mapped_column(default=True, server_default=true())
    created_at: Mapped[CreatedAt]

    player: Mapped[Player] = relationship(back_populates="characters", lazy="raise_on_sql")
    turns: Mapped[list[Turn]] = relationship(
        back_populates="character",
        cascade="save-update, merge, delete, delete-orphan",
        passive_deletes=True,
        lazy="raise",
        order_by="Turn.id",
    )


# --------------------------------------------------------------------------------------------
# Shared stories
# --------------------------------------------------------------------------------------------


class Story(Base):
    """A story played by several players in one channel; its turns are numbered by ``seq``."""

    __tablename__ = "stories"
    __table_args__ = (
        # At most one active story per channel; archived ones pile up freely.
        Index(
            "uq_stories_one_active_per_channel",
            "channel_id",
            unique=True,
            sqlite_where=text("status = 'active'"),
            postgresql_where=text("status = 'active'"),
        ),
    )

    id: Mapped[IntPK]
    guild_id: Mapped[Snowflake] = mapped_column(ForeignKey("guilds.id", ondelete="CASCADE"), index=True)
    channel_id: Mapped[Snowflake]
    title: Mapped[str] = mapped_column(String(100))
    status: Mapped[StoryStatus] = mapped_column(
        _str_enum(StoryStatus, "status"),
        default=StoryStatus.ACTIVE,
        server_default=StoryStatus.ACTIVE.value,
    )
    turn_order: Mapped[TurnOrder] = mapped_column(
        _str_enum(TurnOrder, "turn_order"),
        default=TurnOrder.FREE,
        server_default=TurnOrder.FREE.value,
    )
    # The last seq handed out; bumped with an UPDATE so concurrent turns get distinct numbers.
    last_seq: Mapped[int] = mapped_column(default=0, server_default=text("0"))
    created_by: Mapped[Snowflake]
    created_at: Mapped[CreatedAt]
    ended_at: Mapped[Timestamp | None]
    round_seconds: Mapped[int | None]  # vote order: how long a round stays open after its first proposal
    # /story recap, claimed by one guarded UPDATE (db/recaps.py), so every bot process sees the cooldown and
    # the recap being made: when the last one was asked for, and when the one being made now began.
    recapped_at: Mapped[Timestamp | None]
    recap_started_at: Mapped[Timestamp | None]

    guild: Mapped[Guild] = relationship(back_populates="stories", lazy="raise_on_sql")
    members: Mapped[list[StoryMember]] = relationship(
        back_populates="story",
        cascade="save-update, merge, delete, delete-orphan",
        passive_deletes=True,
        lazy="raise",
        order_by="StoryMember.position",
    )
    turns: Mapped[list[Turn]] = relationship(
        back_populates="story", passive_deletes=True, lazy="raise", order_by="Turn.seq"
    )


class StoryMember(Base):
    __tablename__ = "story_members"
    __table_args__ = (UniqueConstraint("story_id", "character_id"),)

    id: Mapped[IntPK]
    story_id: Mapped[int] = mapped_column(ForeignKey("stories.id", ondelete="CASCADE"))
    character_id: Mapped[int] = mapped_column(ForeignKey("characters.id", ondelete="CASCADE"), index=True)
    position: Mapped[int]  # round-robin order, 0-based, in order of joining
    joined_at: Mapped[CreatedAt]
    left_at: Mapped[Timestamp | None]

    story: Mapped[Story] = relationship(back_populates="members", lazy="raise_on_sql")
    character: Mapped[Character] = relationship(lazy="raise_on_sql")


class StoryRound(Base):
    """One vote of a vote-order story: opened by its first proposal, closed at ``closes_at`` (or early by the
    story's creator), when its winner becomes the story's next turn, once."""

    __tablename__ = "story_rounds"
    __table_args__ = (
        UniqueConstraint("story_id", "number"),
        # One open round per story: two players proposing at once add to the same one.
        Index(
            "uq_story_rounds_one_open_per_story",
            "story_id",
            unique=True,
            sqlite_where=text("status = 'open'"),
            postgresql_where=text("status = 'open'"),
        ),
        Index("ix_story_rounds_status_closes_at", "status", "closes_at"),  # the rounds due to close
    )

    id: Mapped[IntPK]
    story_id: Mapped[int] = mapped_column(ForeignKey("stories.id", ondelete="CASCADE"))
    number: Mapped[int]  # 1, 2, ... within the story
    status: Mapped[RoundStatus] = mapped_column(
        _str_enum(RoundStatus, "status"), default=RoundStatus.OPEN, server_default=RoundStatus.OPEN.value
    )
    closes_at: Mapped[Timestamp]
    message_id: Mapped[Snowflake | None]  # the message listing the proposals, with a button for each
    winner_id: Mapped[int | None]  # the proposal played (not a foreign key: proposals point at their round)
    turn_id: Mapped[int | None] = mapped_column(ForeignKey("turns.id", ondelete="SET NULL"))
    announced: Mapped[bool] = mapped_column(default=False, server_default=false())  # its result was shown
    created_at: Mapped[CreatedAt]


class StoryProposal(Base):
    """A member's proposed next turn in a round: one per member per round."""

    __tablename__ = "story_proposals"
    __table_args__ = (UniqueConstraint("round_id", "user_id"),)

    id: Mapped[IntPK]
    round_id: Mapped[int] = mapped_column(ForeignKey("story_rounds.id", ondelete="CASCADE"))
    user_id: Mapped[Snowflake]
    character_id: Mapped[int] = mapped_column(ForeignKey("characters.id", ondelete="CASCADE"), index=True)
    instruction: Mapped[str] = mapped_column(String(MAX_LINE_CHARS))
    created_at: Mapped[CreatedAt]


class StoryVote(Base):
    """A member's vote in a round, changeable until it closes: one row per member per round."""

    __tablename__ = "story_votes"

    round_id: Mapped[int] = mapped_column(ForeignKey("story_rounds.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[Snowflake] = mapped_column(primary_key=True)
    proposal_id: Mapped[int] = mapped_column(ForeignKey("story_proposals.id", ondelete="CASCADE"), index=True)


# --------------------------------------------------------------------------------------------
# Turns and the jobs that make them
# --------------------------------------------------------------------------------------------


class Turn(Base):
    """One instruction and, once its job is done, what it did to the character.

    Deltas, state after, flow and representation stay NULL until the result is applied, so
    "completed" is ``stamina_after IS NOT NULL``.
    """

    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("story_id", "seq"),
        CheckConstraint("(story_id IS NULL) = (seq IS NULL)", name="seq_iff_story"),
        # A character's newest turns first (history, /history): the id orders them on PostgreSQL too.
        Index("ix_turns_character_id_id", "character_id", "id"),
        # What retention still has to look at, oldest first; a turn leaves each index once emptied.
        Index(
            "ix_turns_with_representation",
            "created_at",
            "id",
            sqlite_where=text("representation IS NOT NULL"),
            postgresql_where=text("representation IS NOT NULL"),
        ),
        Index(
            "ix_turns_with_clip",
            "created_at",
            "id",
            sqlite_where=text("clip_key IS NOT NULL"),
            postgresql_where=text("clip_key IS NOT NULL"),
        ),
        *_range_checks("d_motion", "d_social", "d_entertainment", "d_stamina", low=DELTA_MIN, high=DELTA_MAX),
        *_range_checks("stamina_after", "social_after", "entertainment_after"),
    )

    id: Mapped[IntPK]
    # NULL: a story turn whose player started over (/reset); the story keeps it, "from a former player".
    character_id: Mapped[int | None] = mapped_column(ForeignKey("characters.id", ondelete="CASCADE"))
    story_id: Mapped[int | None] = mapped_column(ForeignKey("stories.id", ondelete="SET NULL"))
    seq: Mapped[int | None]
    instruction: Mapped[str] = mapped_column(String(MAX_LINE_CHARS))
    seed: Mapped[Snowflake]  # 0..2**63-1 per the contract: a BIGINT
    model: Mapped[str] = mapped_column(String(32))
    d_motion: Mapped[int | None]
    d_social: Mapped[int | None]
    d_entertainment: Mapped[int | None]
    d_stamina: Mapped[int | None]
    stamina_after: Mapped[int | None]
    social_after: Mapped[int | None]
    entertainment_after: Mapped[int | None]
    flow: Mapped[float | None] = mapped_column(Float)
    # About 868 KB at the published sizes, needed only by the next prompts' history: never loaded with
    # the row (a lazy load raises); ``undefer(Turn.representation)`` where a prompt needs it.
    representation: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True, deferred_raiseload=True)
    # The clip's key in the bot's clip store (bot/clip_store.py), never a path (revision 0007).
    clip_key: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[CreatedAt]
    timings: Mapped[str | None] = mapped_column(Text)  # JSON {stage: seconds} from the worker (revision 0002)
    # Which weights made (or will make) its representation: the model, and for the published one the
    # character's own MLLM. A prompt's history only carries representations of the same key.
    model_key: Mapped[str | None] = mapped_column(String(100))
    # When retention deleted the clip (clip_key is NULL from then on), so /history can say so (revision 0004).
    clip_expired_at: Mapped[Timestamp | None]
    # What a viewer must be told about the model that made it, as the worker's result said (revision 0005).
    label: Mapped[str | None] = mapped_column(String(100))
    # The worker's nudity detector report (game.safety.SafetyReport as JSON), and why the bot did not post the clip
    # (NULL when it did, or before it decided): revision 0009.
    safety: Mapped[str | None] = mapped_column(Text)
    clip_withheld: Mapped[str | None] = mapped_column(String(300))
    # When its posted clip was taken down, by an admin after reports or by its player (revision 0010): the message
    # and the stored clip are gone, the turn's text and state stay.
    clip_removed_at: Mapped[Timestamp | None]

    character: Mapped[Character | None] = relationship(back_populates="turns", lazy="raise_on_sql")
    story: Mapped[Story | None] = relationship(back_populates="turns", lazy="raise_on_sql")
    job: Mapped[Job | None] = relationship(
        back_populates="turn",
        cascade="save-update, merge, delete, delete-orphan",
        passive_deletes=True,
        lazy="raise",
    )


def new_task_id() -> str:
    """Celery task ids are chosen by us, before sending, so the row and the message agree."""
    return str(uuid.uuid4())


class Job(Base):
    """The queue-side life of a turn (``game.jobs`` holds its rules) and where its messages are."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint("progress BETWEEN 0 AND 1", name="progress_range"),
        CheckConstraint("attempts >= 0", name="attempts_range"),
        Index("ix_jobs_status_id", "status", "id"),
        # One turn in flight per player, whoever submits it (two bots, two shards): the database refuses
        # a second one. Queries find those turns through the index after it.
        Index(
            "uq_jobs_one_in_flight_per_player",
            "guild_id",
            "user_id",
            unique=True,
            sqlite_where=text(IN_FLIGHT_SQL),
            postgresql_where=text(IN_FLIGHT_SQL),
        ),
        # The rows each hot query wants, out of every job ever made, each by equalities only: SQLite's planner
        # (with no statistics, as the bot's database has none) picks the index that matches the most, and
        # preferred (status, id) to partial indexes, walking every finished job for the delivery loop.
        # The last two are partial on PostgreSQL, whose planner prices an index by its own size and
        # otherwise took (status, id) and read every cancelled job.
        Index("ix_jobs_guild_id_status_user_id", "guild_id", "status", "user_id"),  # in flight: a server's, a player's
        Index("ix_jobs_guild_id_user_id_queued_at", "guild_id", "user_id", "queued_at"),  # the hourly quota
        Index("ix_jobs_status_finished_at", "status", "finished_at"),  # the ETA: how often turns finish
        Index(  # finished, not yet posted
            "ix_jobs_to_post",
            "status",
            "result_message_id",
            "id",
            postgresql_where=text(f"{status_sql(JobStatus.DONE)} AND result_message_id IS NULL"),
        ),
        Index(  # cancelled, workers not yet told
            "ix_jobs_cancels_to_mark",
            "status",
            "cancel_marked_at",
            "id",
            postgresql_where=text(f"{status_sql(JobStatus.CANCELLED)} AND cancel_marked_at IS NULL"),
        ),
    )

    id: Mapped[IntPK]
    turn_id: Mapped[int] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"), unique=True)
    task_id: Mapped[str] = mapped_column(String(64), unique=True, default=new_task_id)
    kind: Mapped[JobKind] = mapped_column(_str_enum(JobKind, "kind"), default=JobKind.ACT)
    status: Mapped[JobStatus] = mapped_column(
        _str_enum(JobStatus, "status"),
        default=JobStatus.QUEUED,
        server_default=JobStatus.QUEUED.value,
    )
    progress: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))
    step: Mapped[int] = mapped_column(default=0, server_default=text("0"))
    total: Mapped[int] = mapped_column(default=0, server_default=text("0"))
    error: Mapped[str | None] = mapped_column(Text)
    guild_id: Mapped[Snowflake | None]
    channel_id: Mapped[Snowflake | None]
    user_id: Mapped[Snowflake | None]
    progress_message_id: Mapped[Snowflake | None]
    result_message_id: Mapped[Snowflake | None]
    queued_at: Mapped[CreatedAt]
    started_at: Mapped[Timestamp | None]
    finished_at: Mapped[Timestamp | None]
    applied_at: Mapped[Timestamp | None]
    # The outbox: NULL until the task is handed to the broker (again after a hand-back).
    sent_at: Mapped[Timestamp | None]
    attempts: Mapped[int] = mapped_column(default=0, server_default=text("0"))  # times sent
    # When the current state's owner must have moved it on (game.jobs); NULL once final, and
    # while a story turn waits for the one before it.
    deadline_at: Mapped[Timestamp | None]
    # A cancelled turn: when its workers were told (the cancel mark they check); at once if it was never sent.
    cancel_marked_at: Mapped[Timestamp | None]
    post_attempts: Mapped[int] = mapped_column(default=0, server_default=text("0"))  # failed posts so far

    turn: Mapped[Turn] = relationship(back_populates="job", lazy="raise_on_sql")


# --------------------------------------------------------------------------------------------
# Moderation and bookkeeping
# --------------------------------------------------------------------------------------------


class Ban(Base):
    __tablename__ = "bans"
    __table_args__ = (UniqueConstraint("guild_id", "user_id"),)

    id: Mapped[IntPK]
    guild_id: Mapped[Snowflake] = mapped_column(ForeignKey("guilds.id", ondelete="CASCADE"))
    user_id: Mapped[Snowflake]
    reason: Mapped[str | None] = mapped_column(String(500))
    banned_by: Mapped[Snowflake]
    created_at: Mapped[CreatedAt]


class BlockedTerm(Base):
    __tablename__ = "blocked_terms"
    __table_args__ = (UniqueConstraint("guild_id", "term"),)

    id: Mapped[IntPK]
    guild_id: Mapped[Snowflake] = mapped_column(ForeignKey("guilds.id", ondelete="CASCADE"))
    term: Mapped[str] = mapped_column(String(100))
    added_by: Mapped[Snowflake]
    created_at: Mapped[CreatedAt]


class AuditLog(Base):
    """What admins did, for the guild's own review; ``details`` is free text (often JSON)."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_guild_id_id", "guild_id", "id"),)

    id: Mapped[IntPK]
    guild_id: Mapped[Snowflake] = mapped_column(ForeignKey("guilds.id", ondelete="CASCADE"))
    actor_id: Mapped[Snowflake]
    action: Mapped[str] = mapped_column(String(50))
    target: Mapped[str | None] = mapped_column(String(200))
    details: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[CreatedAt]


class ClipReport(Base):
    """A player's report of a posted clip, for the server's admins (``/admin reports``); one per player and clip.

    Open until an admin removes the clip or dismisses the reports (``resolution``); its turn's deletion (a purge)
    takes it along.
    """

    __tablename__ = "clip_reports"
    __table_args__ = (
        UniqueConstraint("turn_id", "reporter_id"),
        Index("ix_clip_reports_guild_id_resolved_at", "guild_id", "resolved_at"),
    )

    id: Mapped[IntPK]
    guild_id: Mapped[Snowflake] = mapped_column(ForeignKey("guilds.id", ondelete="CASCADE"))
    turn_id: Mapped[int] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"), index=True)
    reporter_id: Mapped[Snowflake]
    created_at: Mapped[CreatedAt]
    resolved_at: Mapped[Timestamp | None]
    resolution: Mapped[str | None] = mapped_column(String(16))  # "removed" or "dismissed"
    resolved_by: Mapped[Snowflake | None]


class ClipDelete(Base):
    """A stored object (a clip or a kept recap, by its key) whose deletion is owed (db/clip_deletes.py): recorded in
    the transaction that clears the key from its row, removed once the store has deleted the object."""

    __tablename__ = "clip_deletes"

    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    created_at: Mapped[CreatedAt]
    attempts: Mapped[int] = mapped_column(default=0, server_default="0")


class ClipCopy(Base):
    """A posted message that holds copies of turns' clips: a /story recap (its clip joins theirs, and its kept object
    in the store) or a /story page (their clips embedded). Withdrawn when one of those clips is removed, purged or
    expired (db/clip_copies.py); the row goes once Discord has deleted the message (bot/clip_copies.py)."""

    __tablename__ = "clip_copies"
    __table_args__ = (
        Index("ix_clip_copies_story_id", "story_id"),
        Index(
            "ix_clip_copies_withdrawn",
            "id",
            sqlite_where=text("withdrawn_at IS NOT NULL"),
            postgresql_where=text("withdrawn_at IS NOT NULL"),
        ),
    )

    id: Mapped[IntPK]
    kind: Mapped[str] = mapped_column(String(16))  # "recap" or "page"
    story_id: Mapped[int]  # no foreign key: the row outlives its story and its turns until the message is gone
    guild_id: Mapped[Snowflake | None]
    channel_id: Mapped[Snowflake]
    message_id: Mapped[Snowflake]
    turn_ids: Mapped[str] = mapped_column(Text)  # ",4,7,9,": the turns whose clips it holds
    recap_key: Mapped[str | None] = mapped_column(String(512))  # the kept recap object it was posted from
    created_at: Mapped[CreatedAt]
    withdrawn_at: Mapped[Timestamp | None]


class AppState(Base):
    """Process-wide facts that outlive a restart, e.g. the hash of the last command sync."""

    __tablename__ = "app_state"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


__all__ = [
    "IN_FLIGHT",
    "IN_FLIGHT_SQL",
    "AllowedChannel",
    "AppState",
    "AuditLog",
    "Ban",
    "BlockedTerm",
    "Character",
    "ClipDelete",
    "ClipReport",
    "Guild",
    "GuildSettings",
    "Job",
    "JobKind",
    "JobStatus",
    "Player",
    "Story",
    "StoryMember",
    "StoryStatus",
    "Turn",
    "TurnOrder",
]


class Lease(Base):
    """A duty one bot process does at a time (db/leases.py): who holds it, and until when.

    A holder renews its lease while it works; when it stops, it gives the lease up, and when it dies the lease
    runs out, so another process takes the duty over within the lease's length.
    """

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[Timestamp]
