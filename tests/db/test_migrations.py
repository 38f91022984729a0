"""The schema comes from the revisions, and the revisions build exactly what the models describe."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

import db.models  # noqa: F401  (registers the tables)
from db.base import Base
from db.engine import DatabaseFileError, make_engine
from db.migrate import current_revision, downgrade, head_revision, upgrade, upgrade_async


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def _sync_url(path: Path) -> str:
    return f"sqlite:///{path}"


def _schema_sql(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """Each table's and index's DDL as SQLite stored it: column part, and its constraints as a set.

    Constraint order differs between ``op.create_table`` and ``create_all``, and a table that a batch
    revision rebuilt has its name quoted and its reflected defaults parenthesised; nothing else may differ.
    """
    con = sqlite3.connect(path)
    try:
        rows = con.execute(
            "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name != 'alembic_version'"
        ).fetchall()
    finally:
        con.close()
    schema = {}
    for name, sql in rows:
        sql = re.sub(r"\s+", " ", sql).strip()
        sql = re.sub(r'^CREATE TABLE "(\w+)"', r"CREATE TABLE \1", sql)
        sql = sql.replace("DEFAULT (CURRENT_TIMESTAMP)", "DEFAULT CURRENT_TIMESTAMP")
        if sql.startswith("CREATE TABLE"):
            sql = sql.removesuffix(")").rstrip()  # the table's closing parenthesis
        head, *constraints = re.split(r",? CONSTRAINT ", sql)
        schema[name] = (head, frozenset(constraints))
    return schema


def test_upgrade_gives_exactly_the_models_schema(db_url: str, tmp_path: Path) -> None:
    engine = create_engine(_sync_url(tmp_path / "game.db"))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_upgrade_ddl_matches_create_all_including_partial_indexes(db_url: str, tmp_path: Path) -> None:
    reference = tmp_path / "create_all.db"
    engine = create_engine(_sync_url(reference))
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()
    migrated = _schema_sql(tmp_path / "game.db")
    assert migrated == _schema_sql(reference)
    assert "WHERE status = 'active'" in migrated["uq_stories_one_active_per_channel"][0]


async def test_upgraded_database_is_at_head(db_url: str) -> None:
    assert head_revision() == "0003"
    assert await current_revision(db_url) == head_revision()


def test_upgrade_twice_is_a_no_op(db_url: str, tmp_path: Path) -> None:
    upgrade(db_url)
    with sqlite3.connect(tmp_path / "game.db") as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(head_revision(),)]


def test_downgrade_to_base_leaves_only_alembic_version(db_url: str, tmp_path: Path) -> None:
    downgrade(db_url, "base")
    con = sqlite3.connect(tmp_path / "game.db")
    try:
        names = {
            n
            for (n,) in con.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%'"
            )
        }
    finally:
        con.close()
    assert names <= {"alembic_version"}


async def test_sync_upgrade_inside_an_event_loop_points_to_the_async_variant(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "loop.db")
    with pytest.raises(RuntimeError, match="upgrade_async"):
        upgrade(url)
    await upgrade_async(url)
    assert await current_revision(url) == head_revision()


async def test_sessions_use_wal_and_foreign_keys(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar_one() == "wal"
        assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar_one() == 1


async def test_foreign_key_violation_is_refused(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        with pytest.raises(IntegrityError, match="FOREIGN KEY"):
            await conn.execute(text("INSERT INTO players (guild_id, user_id) VALUES (999, 1)"))


async def test_missing_parent_folder_is_created(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "deeper" / "game.db"
    engine = make_engine(sqlite_url(path))
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
    assert path.is_file()


async def _connect(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()


async def test_directory_as_database_gives_clear_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "actually_a_folder.db"
    path.mkdir()
    with pytest.raises(DatabaseFileError, match=r"actually_a_folder\.db.*directory") as caught:
        await _connect(sqlite_url(path))
    assert caught.value.path == str(path)


async def test_random_bytes_file_gives_clear_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(DatabaseFileError, match=r"garbage\.db.*not a database"):
        await _connect(sqlite_url(path))


async def test_folder_that_is_a_file_gives_clear_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("not a folder")
    with pytest.raises(DatabaseFileError, match="blocker"):
        await _connect(sqlite_url(tmp_path / "blocker" / "game.db"))


def test_upgrade_of_a_corrupt_file_gives_the_same_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(DatabaseFileError, match=r"garbage\.db"):
        upgrade(sqlite_url(path))


def test_the_lifecycle_revision_keeps_jobs_in_flight_and_labels_old_turns_by_model(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "old.db")
    upgrade(url, "0002")
    with sqlite3.connect(tmp_path / "old.db") as con:
        con.executescript(
            """
            INSERT INTO guilds (id, name) VALUES (1, 'g');
            INSERT INTO players (id, guild_id, user_id) VALUES (1, 1, 5);
            INSERT INTO characters (id, player_id, name, is_active) VALUES (1, 1, 'Sosuke', 1);
            INSERT INTO turns (id, character_id, instruction, seed, model) VALUES (1, 1, 'x', 1, 'animegamer');
            INSERT INTO turns (id, character_id, instruction, seed, model) VALUES (2, 1, 'y', 2, 'toy');
            INSERT INTO jobs (id, turn_id, task_id, kind, status) VALUES (1, 1, 't1', 'act', 'queued');
            """
        )
    upgrade(url)
    with sqlite3.connect(tmp_path / "old.db") as con:
        assert con.execute("SELECT model_key FROM turns ORDER BY id").fetchall() == [("animegamer:sosuke",), ("toy",)]
        ((sent_at, attempts, status),) = con.execute("SELECT sent_at, attempts, status FROM jobs").fetchall()
        assert sent_at is not None and attempts == 1 and status == "queued"  # its task went out before the revision
        con.execute("UPDATE jobs SET status = 'expired'")  # the new state passes the CHECK
        with pytest.raises(sqlite3.IntegrityError):
            con.execute("UPDATE jobs SET status = 'lost'")
