"""The bot under test: the real AnimeGamerBot against the loopback double and a real SQLite file.

Two ways to run it. ``bot_settings`` (the fast tier): the bot's own embedded queue in the test's folder, a real
Celery queue over SQLite that no worker consumes, so a turn sent there stays queued and costs no CPU.
``worker_settings`` (the slow tier): the session's real worker (tiny model), so turns are made and posted.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.app import AnimeGamerBot
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import Character, Job, Turn
from db.queries import GAME_ID
from relay.celery_app import make_celery
from relay.settings import Settings
from tests.discord_double import DiscordDouble
from tests.workers import SHARED_STEPS, Worker, machine, settings_for, start_worker, worker_env

QUICK = {"delivery_poll_seconds": 0.1, "progress_edit_seconds": 1.0}  # a bot that moves jobs every 0.1 s


def settings_beside(worker: Worker, folder: Path, **changes: object) -> Settings:
    """A bot's settings for ``worker``'s queue: a database and clip folder in ``folder``, a quick supervisor."""
    return settings_for(worker.env).model_copy(
        update={"database_url": f"sqlite+aiosqlite:///{folder}/game.db", "data_dir": folder, **QUICK, **changes}
    )


def idle_settings(folder: Path, **changes: object) -> Settings:
    """A bot's settings with its embedded queue in ``folder``, consumed by no worker, and the tiny model."""
    return Settings(data_dir=folder, model="tiny", queue=f"test-{uuid.uuid4().hex[:8]}", **QUICK, **changes)


@pytest.fixture(scope="session")
def migrated_game(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One game database at head, copied for each test's bot: migrating a new one took 0.3 s of each bot's start,
    in some 400 tests. (Tests of migrating at start give their bot a folder of its own.)"""
    path = tmp_path_factory.mktemp("migrated-game") / "game.db"
    upgrade(f"sqlite+aiosqlite:///{path}")
    return path


def game_in(folder: Path, template: Path) -> Path:
    """A copy of the migrated game in ``folder``, with a game id of its own, as a first migration makes one."""
    path = folder / "game.db"
    shutil.copyfile(template, path)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE app_state SET value = ? WHERE key = ?", (f"g{secrets.token_hex(8)}", GAME_ID))
    return path


@pytest.fixture
def bot_settings(tmp_path: Path, migrated_game: Path) -> Settings:
    """This test's own database, clip folder and idle embedded queue: no worker makes its turns."""
    return idle_settings(tmp_path, database_url=f"sqlite+aiosqlite:///{game_in(tmp_path, migrated_game)}")


@pytest.fixture
def worker_settings(sqlite_worker: Worker, tmp_path: Path, migrated_game: Path) -> Settings:
    """The session worker's queue, this test's own database and clip folder: turns are made and posted."""
    game_in(tmp_path, migrated_game)
    return settings_beside(sqlite_worker, tmp_path)


@pytest.fixture
async def double() -> AsyncIterator[DiscordDouble]:
    async with DiscordDouble() as running:
        yield running


@asynccontextmanager
async def running_bot(
    double: DiscordDouble, settings: Settings, worker: Worker | None = None
) -> AsyncIterator[AnimeGamerBot]:
    """The bot on ``worker``'s queue, or on ``settings``' own one, connected to the double until the block ends."""
    bot = AnimeGamerBot(settings, celery_app=worker.app if worker is not None else make_celery(settings))
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


@pytest.fixture(scope="module")
def fleet_worker(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Worker]:
    """One plain worker for a file's fleet tests, in a folder of its own on the shared Redis: a worker's start is
    about 7 s of CPU (torch, transformers and diffusers imported), and each test's bots send to its queue."""
    gpu = tmp_path_factory.mktemp("gpu-machine")
    worker = start_worker({**worker_env(gpu / "data", redis_url, **SHARED_STEPS), **machine(gpu)}, cwd=gpu)
    yield worker
    worker.kill()
