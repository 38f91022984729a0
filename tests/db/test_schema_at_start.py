"""Who migrates: the bot its own SQLite file at start; an operator a server database (`animegamer db upgrade`),
the bot refusing to start on an older schema with the command to run; processes that upgrade together, once."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from db.migrate import SchemaNotCurrent, current_revision, head_revision, ready_schema, upgrade
from tests import tiers
from tests.crowd import BotProcess, bot_argv, discord_env
from tests.db.conftest import Postgres, sqlite_url
from tests.discord_double import DiscordDouble
from tests.workers import REPO


async def test_the_embedded_sqlite_file_is_migrated_at_start_by_default(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "game.db")
    await ready_schema(url)
    assert await current_revision(url) == head_revision()


async def test_a_bot_told_not_to_migrate_refuses_an_older_schema_naming_the_command(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "game.db")
    await asyncio.to_thread(upgrade, url, "0006")
    needs = rf"revision 0006 and this code needs {head_revision()}: run `animegamer db upgrade`"
    with pytest.raises(SchemaNotCurrent, match=needs):
        await ready_schema(url, "never")
    assert await current_revision(url) == "0006"  # untouched


async def test_a_schema_from_a_newer_version_is_refused_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "game.db"
    await asyncio.to_thread(upgrade, sqlite_url(path))
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0099'")
    with pytest.raises(SchemaNotCurrent, match="revision 0099, which this code does not know"):
        await ready_schema(sqlite_url(path), "never")


@pytest.fixture
def server_database(postgres: Postgres) -> Iterator[str]:
    if reason := postgres.unavailable():
        pytest.skip(reason)
    name = postgres.new_database()
    yield postgres.url_for(name)
    postgres.drop(name)


@tiers.SLOW
async def test_a_server_database_is_left_to_the_operator_by_default(server_database: str) -> None:
    with pytest.raises(SchemaNotCurrent, match="no schema yet: run `animegamer db upgrade`"):
        await ready_schema(server_database)
    await ready_schema(server_database, "always")
    assert await current_revision(server_database) == head_revision()


@tiers.SLOW
def test_two_processes_migrating_a_new_postgresql_at_once_both_succeed_and_it_is_migrated_once(
    server_database: str,
) -> None:
    """From an empty database every revision runs (about a second): without the lock the second process fails on
    tables the first made (3 runs in 3); with it, the second waits and finds nothing to do."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANIMEGAMER_")}}
    env["ANIMEGAMER_DATABASE_URL"] = server_database
    argv = [sys.executable, "-m", "animegamer", "db", "upgrade"]
    both = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in "ab"]
    outputs = [process.communicate(timeout=120) for process in both]
    assert [process.returncode for process in both] == [0, 0], [err.decode()[-2000:] for _, err in outputs]
    assert asyncio.run(current_revision(server_database)) == head_revision()


@tiers.SLOW
async def test_the_bot_process_refuses_to_start_on_an_older_schema_and_says_what_to_run(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "game.db")
    await asyncio.to_thread(upgrade, url, "0006")
    async with DiscordDouble() as double:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ANIMEGAMER_")},
            **discord_env(double),
            "ANIMEGAMER_DATA_DIR": str(tmp_path / "data"),
            "ANIMEGAMER_DATABASE_URL": url,
            "ANIMEGAMER_MIGRATE_AT_START": "never",
        }
        bot = BotProcess(bot_argv(), env, tmp_path / "bot.log").start()
        assert bot.proc is not None
        status = await asyncio.to_thread(bot.proc.wait, 60)
    log = bot.log.read_text(errors="replace")
    assert status == 1 and "run `animegamer db upgrade`" in log, log[-3000:]
    assert "Traceback" not in log
