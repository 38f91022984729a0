"""A migration that fails leaves the database as it was: one transaction for the whole upgrade (migrations/env.py).

Caused for real: revision 0007 renames a column, rewrites its values and rebuilds an index; a trigger that refuses
the rewrite fails it half way, after the rename has run.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from db.migrate import upgrade
from tests.db.conftest import sqlite_url

REFUSE = "CREATE TRIGGER refuse_rewrite BEFORE UPDATE ON turns BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"


def schema(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as connection:
        return connection.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()


def one_value(column_type: str) -> object:
    kind = column_type.upper()
    if kind.startswith(("INT", "BOOL", "FLOAT", "NUMERIC", "REAL", "SMALLINT", "BIGINT")):
        return 0
    return "2026-01-01 00:00:00.000000" if kind.startswith(("DATETIME", "TIMESTAMP")) else "x"


def add_turn_with_clip(path: Path, clip_path: str) -> None:
    """A turn row at revision 0006, every required column given something of its type (no parents: the plain
    sqlite3 connection leaves foreign keys off)."""
    with sqlite3.connect(path) as connection:
        columns = connection.execute("PRAGMA table_info(turns)").fetchall()
        row = {name: one_value(kind) for _, name, kind, notnull, default, pk in columns if notnull and not pk}
        row["clip_path"] = clip_path
        connection.execute(
            f"INSERT INTO turns ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
        )


def test_a_revision_that_fails_half_way_leaves_the_sqlite_database_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "game.db"
    upgrade(sqlite_url(path), "0006")
    add_turn_with_clip(path, "data/clips/1/job_1.mp4")
    with sqlite3.connect(path) as connection:
        connection.execute(REFUSE)
    before = schema(path)

    with pytest.raises(Exception, match="refused by the test"):
        upgrade(sqlite_url(path))

    assert schema(path) == before  # the column still clip_path, its index there, no _alembic_tmp_ table
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == [("0006",)]
        assert connection.execute("SELECT clip_path FROM turns").fetchall() == [("data/clips/1/job_1.mp4",)]
        connection.execute("DROP TRIGGER refuse_rewrite")
    upgrade(sqlite_url(path))  # the cause gone, the same upgrade goes through
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT clip_key FROM turns").fetchall() == [("1/job_1.mp4",)]
