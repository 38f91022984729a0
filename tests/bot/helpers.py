"""What the admin, refusal and bad-input tests share: answers as a player sees them, rows as the bot writes them.

Rows are written through ``db.queries`` in the test's own session (after the bot has migrated the file), so
a test can put a turn in flight or a finished turn on record without waiting for the worker.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from celery import Celery
from sqlalchemy import create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.app import AnimeGamerBot
from bot.clip_store import ClipStore, FolderStore
from db.engine import make_engine, make_sessionmaker
from db.jobs import apply_result, create_turn, set_job_messages
from db.models import (
    AllowedChannel,
    AppState,
    AuditLog,
    Ban,
    BlockedTerm,
    Character,
    ClipReport,
    GuildSettings,
    Job,
    Player,
    Turn,
)
from db.queries import GAME_ID, game_id, get_or_create_character
from game.safety import SafetyReport
from relay.celery_app import make_celery
from relay.settings import Settings
from tests.discord_double import DiscordDouble, InteractionHandle, Recorded
from tests.results import turn_result

EPHEMERAL = 1 << 6


def _someone(double: DiscordDouble) -> object:
    return double.player


# Every slash command, with options that make it do its work (given the double, for channels and members).
ALL_COMMANDS: list[tuple[str, Callable[[DiscordDouble], dict]]] = [
    ("start", lambda d: {"character": "Sosuke"}),
    ("status", lambda d: {}),
    ("history", lambda d: {}),
    ("reset", lambda d: {}),
    ("queue", lambda d: {}),
    ("cancel", lambda d: {}),
    ("act", lambda d: {"motion": "gently wave", "background": "day town"}),
    ("story start", lambda d: {"title": "Another story"}),
    ("story join", lambda d: {}),
    ("story act", lambda d: {"motion": "quickly run", "background": "night town"}),
    ("story recap", lambda d: {}),
    ("story page", lambda d: {}),
    ("story propose", lambda d: {"motion": "gently wave", "background": "day town"}),
    ("story close", lambda d: {}),
    ("story leave", lambda d: {}),
    ("profile", lambda d: {}),
    ("board", lambda d: {}),
    ("story end", lambda d: {}),
    ("admin ban", lambda d: {"user": _someone(d), "reason": "spam"}),
    ("admin unban", lambda d: {"user": _someone(d)}),
    ("admin terms add", lambda d: {"term": "dragon"}),
    ("admin terms remove", lambda d: {"term": "dragon"}),
    ("admin terms list", lambda d: {}),
    ("admin channels allow", lambda d: {"channel": d.guild.channel}),
    ("admin channels deny", lambda d: {"channel": d.guild.channel}),
    ("admin channels list", lambda d: {}),
    ("admin quota", lambda d: {"turns_per_hour": 5, "max_queued": 3}),
    ("admin history", lambda d: {"window": 3}),
    ("admin pause", lambda d: {}),
    ("admin resume", lambda d: {}),
    ("admin purge", lambda d: {"user": _someone(d)}),
    ("admin safety", lambda d: {"policy": "age_restricted", "threshold": 0.6}),
    ("admin reports list", lambda d: {}),
    ("admin reports remove", lambda d: {"job": 1}),
    ("admin reports dismiss", lambda d: {"job": 1}),
    ("admin audit", lambda d: {}),
    ("admin stats", lambda d: {}),
]
NO_PINGS = {"parse": []}
LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."


def shown(recorded: Recorded) -> dict:
    """The message a call shows: a callback's ``data``, or a followup's or an edit's body."""
    body = recorded.json or {}
    return body.get("data") or {} if "type" in body else body


async def accepted(handle: InteractionHandle) -> str:
    """A turn taken: a public "thinking…" within the deadline, then filled with its progress message (returned)."""
    assert (await handle.response()).json["type"] == 5
    answer = await handle.answer()
    assert answer.method == "PATCH", f"the turn was refused: {shown(answer)}"
    return shown(answer)["content"]


def private_text(recorded: Recorded) -> str:
    """The text of an answer only its reader sees (a callback message or a followup), which pings nobody."""
    body = recorded.json
    data = body["data"] if "type" in body else body
    if "type" in body:
        assert body["type"] == 4, f"expected a message answer (4), got callback type {body['type']}: {body}"
    assert data.get("flags", 0) & EPHEMERAL, f"the answer is public: {data}"
    assert data.get("allowed_mentions") == NO_PINGS, f"the answer may ping someone: {data.get('allowed_mentions')}"
    return data["content"]


def refusal(recorded: Recorded, *words: str) -> str:
    """A refusal: one short private sentence that contains each of ``words`` (ignoring case)."""
    text = private_text(recorded)
    assert "\n" not in text and len(text) <= 300, f"a refusal is one short sentence, got {text!r}"
    for word in words:
        assert word.casefold() in text.casefold(), f"{word!r} is not in the refusal {text!r}"
    return text


@asynccontextmanager
async def db_session(settings: Settings) -> AsyncIterator[AsyncSession]:
    """One transaction on the bot's database with an engine of the test's own."""
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            yield session
    finally:
        await engine.dispose()


async def count_rows(settings: Settings, model: type) -> int:
    async with db_session(settings) as session:
        return (await session.execute(select(func.count()).select_from(model))).scalar_one()


async def turns_and_jobs(settings: Settings) -> tuple[int, int]:
    return await count_rows(settings, Turn), await count_rows(settings, Job)


async def snapshot(settings: Settings) -> dict[str, list[tuple]]:
    """Every row an admin command can change, to compare before and after a refused command."""
    tables = (AllowedChannel, AuditLog, Ban, BlockedTerm, Character, ClipReport, GuildSettings, Job, Player, Turn)
    seen: dict[str, list[tuple]] = {}
    async with db_session(settings) as session:
        for model in tables:
            columns = [c for c in model.__table__.columns if c.name != "representation"]
            rows = (await session.execute(select(*columns).order_by(*model.__table__.primary_key.columns))).all()
            seen[model.__tablename__] = [tuple(row) for row in rows]
    return seen


async def seed_turn(
    settings: Settings,
    guild_id: int,
    channel_id: int,
    user_id: int,
    *,
    character: str = "Qiqi",
    done: bool = False,
    line: str | None = None,
    posted: bool = True,
    safety: SafetyReport | None = None,
) -> int:
    """A turn as /act leaves it (queued; its task never sent, so it stays in flight), or finished and posted.

    A finished turn has its result applied (with ``safety`` as its detector report, clean by default) and its clip
    written where the delivery loop writes clips; unless ``posted``, the delivery loop posts it. Returns the job id.
    """
    async with db_session(settings) as session:
        played = await get_or_create_character(session, guild_id, user_id, character)
        _, job = await create_turn(
            session,
            played,
            line or f"Character: {character}; Motion: wave; Background: town.",
            7,
            "tiny",
            guild_id=guild_id,
            channel_id=channel_id,
            user_id=user_id,
        )
        if done:
            store = ClipStore.of(settings)
            store.game = await game_id(session)
            store.put(store.key(guild_id, job.id), b"not really an mp4")
            result = turn_result(job.id, **({"safety": safety} if safety is not None else {}))
            assert await apply_result(session, job.id, result, store.key(guild_id, job.id))
            if posted:
                await set_job_messages(session, job.id, result_message_id=1)  # already posted: nothing to deliver
        return job.id


def game_store(settings: Settings) -> ClipStore:
    """The game's clip store as its bot uses it: new keys under the game's id, read from its SQLite database."""
    store = ClipStore.of(settings)
    engine = create_engine(settings.database_url.replace("sqlite+aiosqlite", "sqlite"))
    try:
        with engine.connect() as connection:
            store.game = connection.execute(select(AppState.value).where(AppState.key == GAME_ID)).scalar_one()
    finally:
        engine.dispose()
    return store


def kept_recaps(store: ClipStore) -> list[str]:
    """The recaps the store keeps for its game."""
    return store.keys(f"{store.game}/recaps/")


def clip_path(settings: Settings, guild_id: int, job_id: int) -> Path:
    store = game_store(settings)
    assert isinstance(store, FolderStore)
    return store.path(store.key(guild_id, job_id))


def idle_queue(settings: Settings, tmp_path: Path) -> Celery:
    """A real Celery queue that no worker consumes: a turn sent there stays queued, and costs no CPU."""
    return make_celery(
        settings.model_copy(
            update={
                "broker_url": f"sqla+sqlite:///{tmp_path}/idle-broker.db",
                "result_backend": f"db+sqlite:///{tmp_path}/idle-results.db",
            }
        )
    )


@asynccontextmanager
async def running_bot_on(double: DiscordDouble, settings: Settings, queue: Celery) -> AsyncIterator[AnimeGamerBot]:
    """``running_bot`` with a queue of the test's choosing instead of the session's worker."""
    bot = AnimeGamerBot(settings, celery_app=queue)
    async with double.running(bot, timeout=30):
        yield bot


def dead_queue(settings: Settings) -> Celery:
    """A Celery app whose broker does not answer (nothing listens on port 9); its result store still does."""
    return make_celery(settings.model_copy(update={"broker_url": "redis://127.0.0.1:9/0", "broker_timeout": 1.0}))


__all__ = [
    "ALL_COMMANDS",
    "LINE",
    "Character",
    "Job",
    "Turn",
    "accepted",
    "clip_path",
    "count_rows",
    "db_session",
    "dead_queue",
    "idle_queue",
    "private_text",
    "refusal",
    "running_bot_on",
    "seed_turn",
    "shown",
    "snapshot",
    "turns_and_jobs",
]


class WriteLock:
    """Another process's writer: holds SQLite's write lock on the game database until released."""

    def __init__(self, path: Path) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None)

    def __enter__(self) -> WriteLock:
        self.connection.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *exc: object) -> None:
        self.connection.execute("ROLLBACK")
        self.connection.close()
