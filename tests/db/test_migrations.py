"""The schema comes from the revisions, and the revisions build exactly what the models describe.

On SQLite and on PostgreSQL (``conftest``); what only SQLite has (its file, its pragmas) is tested on SQLite alone.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import NullPool, create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

import db.models  # noqa: F401  (registers the tables)
from db.base import Base
from db.engine import DatabaseFileError, make_engine, sqlite_path
from db.migrate import current_revision, downgrade, head_revision, upgrade, upgrade_async
from tests.db.conftest import sqlite_url


def run_sql(url: str, *statements: str) -> list[tuple]:
    """Run statements in one transaction with an engine of their own; the last one's rows."""

    async def run() -> list[tuple]:
        engine = make_engine(url, poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                rows: list[tuple] = []
                for statement in statements:
                    result = await conn.execute(text(statement))
                    rows = [tuple(row) for row in result.all()] if result.returns_rows else []
                return rows
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _schema(url: str) -> dict[str, object]:
    """The schema as the database itself describes it, in a form two databases can be compared by."""
    path = sqlite_path(url)
    if path is not None:
        return _schema_sql(path)
    columns = run_sql(
        url,
        "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name <> 'alembic_version' ORDER BY table_name, ordinal_position",
    )
    indexes = run_sql(
        url,
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename <> 'alembic_version'",
    )
    constraints = run_sql(
        url,
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE connamespace = 'public'::regnamespace",
    )
    constraints = [row for row in constraints if row[0] != "alembic_version"]
    return {"columns": columns, "indexes": sorted(indexes), "constraints": sorted(constraints)}


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
        sql = re.sub(r"DEFAULT \((-?\d+)\)", r"DEFAULT \1", sql)  # a table batch mode rebuilt: the same default
        if sql.startswith("CREATE TABLE"):
            sql = sql.removesuffix(")").rstrip()  # the table's closing parenthesis
        head, *constraints = re.split(r",? CONSTRAINT ", sql)
        schema[name] = (head, frozenset(constraints))
    return schema


async def test_upgrade_gives_exactly_the_models_schema(engine: AsyncEngine) -> None:
    def compare(conn) -> list:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return compare_metadata(context, Base.metadata)

    async with engine.connect() as conn:
        assert await conn.run_sync(compare) == []


def test_upgrade_ddl_matches_create_all_including_partial_indexes(db_url: str, new_db_url: Callable[[], str]) -> None:
    reference = new_db_url()
    sync_url = make_url(reference).set(drivername=make_url(reference).get_backend_name())
    if sqlite_path(reference) is None:  # PostgreSQL: no sync driver is installed; create_all through asyncpg
        asyncio.run(_create_all(reference))
    else:
        engine = create_engine(sync_url)
        try:
            Base.metadata.create_all(engine)
        finally:
            engine.dispose()
    migrated = _schema(db_url)
    assert migrated == _schema(reference)
    for name in PARTIAL_INDEXES:  # the models' partial indexes came out partial
        assert " WHERE " in _index_sql(migrated, name)


PARTIAL_INDEXES = (
    "uq_stories_one_active_per_channel",
    "uq_characters_one_active_per_player",
    "uq_jobs_one_in_flight_per_player",
    "ix_turns_with_representation",
    "ix_turns_with_clip",
)


def _index_sql(schema: dict, name: str) -> str:
    return dict(schema["indexes"])[name] if "indexes" in schema else schema[name][0]


async def _create_all(url: str) -> None:
    engine = make_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
    finally:
        await engine.dispose()


async def test_upgraded_database_is_at_head(db_url: str) -> None:
    assert head_revision() == "0013"
    assert await current_revision(db_url) == head_revision()


async def stored_game_id(url: str) -> str | None:
    engine = make_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            found = await conn.execute(text("SELECT value FROM app_state WHERE key = 'game_id'"))
            return found.scalar_one_or_none()
    finally:
        await engine.dispose()


async def test_each_database_gets_a_game_id_of_its_own_when_first_migrated_and_keeps_it(tmp_path: Path) -> None:
    """Every clip store key starts with it (revision 0011): two games' ids differ, and upgrading again keeps it."""
    made = []
    for name in ("first", "second"):
        url = sqlite_url(tmp_path / f"{name}.db")
        await upgrade_async(url)
        made.append(await stored_game_id(url))
        await upgrade_async(url)
        assert await stored_game_id(url) == made[-1]
    assert made[0] != made[1] and all(re.fullmatch(r"g[0-9a-f]{16}", str(game)) for game in made), made


def test_upgrade_twice_is_a_no_op(db_url: str) -> None:
    upgrade(db_url)
    assert run_sql(db_url, "SELECT version_num FROM alembic_version") == [(head_revision(),)]


def test_downgrade_to_base_leaves_only_alembic_version(new_db_url: Callable[[], str]) -> None:
    url = new_db_url()
    upgrade(url)
    downgrade(url, "base")

    async def names() -> set[str]:
        engine = make_engine(url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(
                    lambda sync: {
                        name
                        for table in inspect(sync).get_table_names()
                        for name in (table, *(ix["name"] for ix in inspect(sync).get_indexes(table)))
                    }
                )
        finally:
            await engine.dispose()

    assert asyncio.run(names()) <= {"alembic_version"}


async def test_sync_upgrade_inside_an_event_loop_points_to_the_async_variant(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "loop.db")
    with pytest.raises(RuntimeError, match="upgrade_async"):
        upgrade(url)
    await upgrade_async(url)
    assert await current_revision(url) == head_revision()


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    url = sqlite_url(tmp_path / "game.db")
    await upgrade_async(url)
    engine = make_engine(url)
    yield engine
    await engine.dispose()


async def test_sqlite_sessions_use_wal_and_foreign_keys(sqlite_engine: AsyncEngine) -> None:
    async with sqlite_engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar_one() == "wal"
        assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar_one() == 1


async def test_foreign_key_violation_is_refused(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        with pytest.raises(IntegrityError, match=r"(?i)foreign key"):
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


def test_the_lifecycle_revision_keeps_jobs_in_flight_and_labels_old_turns_by_model(
    new_db_url: Callable[[], str],
) -> None:
    url = new_db_url()
    upgrade(url, "0002")
    run_sql(
        url,
        "INSERT INTO guilds (id, name) VALUES (1, 'g')",
        "INSERT INTO players (id, guild_id, user_id) VALUES (1, 1, 5)",
        "INSERT INTO characters (id, player_id, name, is_active) VALUES (1, 1, 'Sosuke', TRUE)",
        "INSERT INTO turns (id, character_id, instruction, seed, model) VALUES (1, 1, 'x', 1, 'animegamer')",
        "INSERT INTO turns (id, character_id, instruction, seed, model) VALUES (2, 1, 'y', 2, 'toy')",
        "INSERT INTO jobs (id, turn_id, task_id, kind, status) VALUES (1, 1, 't1', 'act', 'queued')",
    )
    upgrade(url)
    assert run_sql(url, "SELECT model_key FROM turns ORDER BY id") == [("animegamer:sosuke",), ("toy",)]
    ((sent_at, attempts, status),) = run_sql(url, "SELECT sent_at, attempts, status FROM jobs")
    assert sent_at is not None and attempts == 1 and status == "queued"  # its task went out before the revision
    run_sql(url, "UPDATE jobs SET status = 'expired'")  # the new state passes the CHECK
    with pytest.raises(IntegrityError):
        run_sql(url, "UPDATE jobs SET status = 'lost'")


def test_revision_0004_keeps_each_players_oldest_turn_in_flight_and_cancels_the_others(
    new_db_url: Callable[[], str],
) -> None:
    url = new_db_url()
    upgrade(url, "0003")
    run_sql(
        url,
        "INSERT INTO guilds (id, name) VALUES (1, 'g')",
        "INSERT INTO players (id, guild_id, user_id) VALUES (1, 1, 5), (2, 1, 6)",
        "INSERT INTO characters (id, player_id, name, is_active) VALUES (1, 1, 'Qiqi', FALSE), (2, 1, 'Sosuke', TRUE)",
        "INSERT INTO characters (id, player_id, name, is_active) VALUES (3, 2, 'Kiki', TRUE)",
        # Player 5 switched characters while a turn was in flight (the rule was per character): two in flight.
        "INSERT INTO turns (id, character_id, instruction, seed, model, clip_path) VALUES "
        "(1, 1, 'a', 1, 'toy', 'clips/1.mp4'), (2, 2, 'b', 1, 'toy', NULL), (3, 3, 'c', 1, 'toy', NULL), "
        "(4, 1, 'd', 1, 'toy', NULL), (6, 3, 'f', 1, 'toy', NULL)",
        "INSERT INTO jobs (id, turn_id, task_id, kind, status, guild_id, user_id, sent_at) VALUES "
        "(1, 4, 't4', 'act', 'done', 1, 5, CURRENT_TIMESTAMP), (2, 1, 't1', 'act', 'queued', 1, 5, CURRENT_TIMESTAMP), "
        "(3, 2, 't2', 'act', 'running', 1, 5, CURRENT_TIMESTAMP), (4, 3, 't3', 'act', 'queued', 1, 6, NULL), "
        "(6, 6, 't6', 'act', 'cancelled', 1, 6, NULL)",
    )
    upgrade(url, "0004")
    rows = run_sql(url, "SELECT id, status, error IS NOT NULL, cancel_marked_at IS NOT NULL FROM jobs ORDER BY id")
    # Job 3, cancelled after it was sent, waits for its workers to be told (the supervisor's cancel marks find
    # it); job 6, cancelled before it was sent, has no workers to tell.
    assert [(i, status, bool(error), bool(told)) for i, status, error, told in rows] == [
        (1, "done", False, False),
        (2, "queued", False, False),
        (3, "cancelled", True, False),
        (4, "queued", False, False),
        (6, "cancelled", False, True),
    ]
    assert run_sql(url, "SELECT clip_path, clip_expired_at FROM turns WHERE id = 1") == [("clips/1.mp4", None)]
    run_sql(url, "INSERT INTO turns (id, character_id, instruction, seed, model) VALUES (5, 2, 'e', 1, 'toy')")
    with pytest.raises(IntegrityError):
        run_sql(
            url,
            "INSERT INTO jobs (id, turn_id, task_id, kind, status, guild_id, user_id) "
            "VALUES (5, 5, 't5', 'act', 'queued', 1, 5)",
        )


def test_revision_0005_labels_earlier_turns_by_the_model_that_made_them(new_db_url: Callable[[], str]) -> None:
    url = new_db_url()
    upgrade(url, "0004")
    run_sql(
        url,
        "INSERT INTO guilds (id, name) VALUES (1, 'g')",
        "INSERT INTO players (id, guild_id, user_id) VALUES (1, 1, 5)",
        "INSERT INTO characters (id, player_id, name, is_active) VALUES (1, 1, 'Qiqi', TRUE)",
        "INSERT INTO turns (id, character_id, instruction, seed, model) VALUES "
        "(1, 1, 'a', 1, 'tiny'), (2, 1, 'b', 1, 'full'), (3, 1, 'c', 1, 'toy'), (4, 1, 'd', 1, 'animegamer')",
    )
    upgrade(url)
    assert run_sql(url, "SELECT id, label FROM turns ORDER BY id") == [
        (1, "tiny model, random weights"),
        (2, "full-size model, random weights"),
        (3, "toy model, trained on the toy world"),
        (4, None),
    ]


def test_revision_0006_keeps_stories_and_its_downgrade_drops_only_vote_stories(new_db_url: Callable[[], str]) -> None:
    url = new_db_url()
    upgrade(url, "0005")
    run_sql(
        url,
        "INSERT INTO guilds (id, name) VALUES (1, 'g')",
        "INSERT INTO stories (id, guild_id, channel_id, title, turn_order, created_by) VALUES "
        "(1, 1, 10, 'free one', 'free', 5), (2, 1, 11, 'in turn', 'round_robin', 5)",
    )
    upgrade(url)
    assert run_sql(url, "SELECT id, turn_order, round_seconds FROM stories ORDER BY id") == [
        (1, "free", None),
        (2, "round_robin", None),
    ]
    run_sql(
        url,
        "INSERT INTO stories (id, guild_id, channel_id, title, turn_order, created_by, round_seconds) VALUES "
        "(3, 1, 12, 'voted', 'vote', 5, 180)",
    )
    downgrade(url, "0005")
    assert run_sql(url, "SELECT id FROM stories ORDER BY id") == [(1,), (2,)]  # 0005 cannot hold a vote story
    with pytest.raises(IntegrityError):
        run_sql(
            url,
            "INSERT INTO stories (guild_id, channel_id, title, turn_order, created_by) VALUES (1, 13, 't', 'vote', 5)",
        )


def test_revision_0007_turns_stored_clip_paths_into_keys_and_its_downgrade_back(new_db_url: Callable[[], str]) -> None:
    url = new_db_url()
    upgrade(url, "0006")
    run_sql(
        url,
        "INSERT INTO guilds (id, name) VALUES (1, 'g')",
        "INSERT INTO players (id, guild_id, user_id) VALUES (1, 1, 5)",
        "INSERT INTO characters (id, player_id, name, is_active) VALUES (1, 1, 'Qiqi', TRUE)",
        "INSERT INTO turns (id, character_id, instruction, seed, model, clip_path) VALUES "
        "(1, 1, 'a', 1, 'toy', 'data/clips/1/job_1.mp4'), (2, 1, 'b', 1, 'toy', '/srv/bot/data/clips/1/job_2.mp4'), "
        "(3, 1, 'c', 1, 'toy', NULL), (4, 1, 'd', 1, 'toy', '/elsewhere/job_4.mp4')",
    )
    upgrade(url)
    assert run_sql(url, "SELECT id, clip_key FROM turns ORDER BY id") == [
        (1, "1/job_1.mp4"),
        (2, "1/job_2.mp4"),
        (3, None),
        (4, "/elsewhere/job_4.mp4"),  # not in a clip folder: kept, and read as the path it is
    ]
    downgrade(url, "0006")
    assert run_sql(url, "SELECT id, clip_path FROM turns ORDER BY id") == [
        (1, "data/clips/1/job_1.mp4"),
        (2, "data/clips/1/job_2.mp4"),
        (3, None),
        (4, "/elsewhere/job_4.mp4"),
    ]


def test_revision_0008_keeps_stories_unclaimed_and_its_downgrade_drops_the_leases(
    new_db_url: Callable[[], str],
) -> None:
    url = new_db_url()
    upgrade(url, "0007")
    run_sql(
        url,
        "INSERT INTO guilds (id, name) VALUES (1, 'g')",
        "INSERT INTO stories (id, guild_id, channel_id, title, turn_order, created_by) "
        "VALUES (1, 1, 10, 't', 'free', 5)",
    )
    upgrade(url)
    assert run_sql(url, "SELECT id, recapped_at, recap_started_at FROM stories") == [(1, None, None)]
    run_sql(url, "INSERT INTO leases (name, holder, expires_at) VALUES ('outbox', 'a', CURRENT_TIMESTAMP)")
    downgrade(url, "0007")
    assert run_sql(url, "SELECT id, title FROM stories") == [(1, "t")]
    with pytest.raises(Exception, match="leases"):
        run_sql(url, "SELECT * FROM leases")
