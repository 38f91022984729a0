"""The bot under test: the real AnimeGamerBot against the loopback double, a real SQLite file,
and the session's real Celery worker (tiny model) on the SQLite broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from sqlalchemy import select

from animegamer.settings import Settings
from bot.app import AnimeGamerBot
from db.engine import make_engine, make_sessionmaker
from db.models import Character, Job, Turn
from tests.discord_double import DiscordDouble
from tests.workers import Worker, settings_for


def settings_beside(worker: Worker, folder: Path, **changes: object) -> Settings:
    """A bot's settings for ``worker``'s queue: a database and clip folder in ``folder``, a quick supervisor."""
    return settings_for(worker.env).model_copy(
        update={
            "database_url": f"sqlite+aiosqlite:///{folder}/game.db",
            "data_dir": folder,
            "delivery_poll_seconds": 0.1,
            "progress_edit_seconds": 1.0,
            **changes,
        }
    )


@pytest.fixture
def bot_settings(sqlite_worker: Worker, tmp_path: Path) -> Settings:
    """The session worker's queue, this test's own database and clip folder."""
    return settings_beside(sqlite_worker, tmp_path)


@pytest.fixture
async def double() -> AsyncIterator[DiscordDouble]:
    async with DiscordDouble() as running:
        yield running


@asynccontextmanager
async def running_bot(double: DiscordDouble, settings: Settings, worker: Worker) -> AsyncIterator[AnimeGamerBot]:
    bot = AnimeGamerBot(settings, celery_app=worker.app)
    async with double.running(bot, timeout=30):
        yield bot


async def read_db(settings: Settings, query):
    """Read the game database as an outsider would, with an engine of its own."""
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            return list((await session.execute(query)).all())
    finally:
        await engine.dispose()


async def wait_for_db(settings: Settings, query, predicate, timeout: float = 30.0):
    """Poll the database until ``predicate(rows)`` holds: the bot records things just after it posts them."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        rows = await read_db(settings, query)
        if predicate(rows):
            return rows
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the database never reached the expected state: {rows}")
        await asyncio.sleep(0.1)


__all__ = ["Character", "Job", "Turn", "read_db", "running_bot", "select", "settings_beside", "wait_for_db"]
