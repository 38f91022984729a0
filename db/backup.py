"""A consistent copy of a live SQLite game database, taken with SQLite's online backup API.

Copying the file (or the file and its WAL) while the bot writes can catch a transaction half on disk; the backup
API copies the database as one reader sees it, so the copy holds every committed turn and no part of one that was
not. It is written beside the target and renamed into place only once whole and checked: a failed backup leaves no
file that looks like one. PostgreSQL has its own tools (pg_dump); docs/operating.md says how.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from db.engine import sqlite_path

BUSY_SECONDS = 30.0  # how long the copy waits for a writer's lock (the bot's transactions take milliseconds)


class BackupError(RuntimeError):
    """The backup was not made; the message says why and what to do."""


@dataclass(frozen=True)
class Backup:
    path: Path
    bytes: int
    revision: str | None  # the schema's Alembic revision in the copy
    turns: int


def backup_sqlite(url: str, target: Path) -> Backup:
    source = sqlite_path(url)
    if source is None:
        shown = make_url(url).render_as_string(hide_password=True)
        raise BackupError(f"{shown} is not a SQLite file: back PostgreSQL up with pg_dump (docs/operating.md)")
    if not source.is_file():
        raise BackupError(f"there is no game database at {source}: check ANIMEGAMER_DATABASE_URL")
    if target.exists():
        raise BackupError(f"{target} already exists: choose a new name (a backup never overwrites a file)")
    partial = target.with_name(target.name + ".partial")
    try:
        # Read-only: a backup can never change the game, even by creating a missing file.
        reader = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=BUSY_SECONDS)
        with contextlib.closing(reader) as src, contextlib.closing(sqlite3.connect(partial)) as dst:
            src.backup(dst)  # all pages in one step: one reader's snapshot, whatever the bot writes meanwhile
            checked = dst.execute("PRAGMA integrity_check").fetchone()[0]
            if checked != "ok":
                raise BackupError(f"the copy of {source} fails SQLite's integrity check: {checked}")
            revision, turns = _facts(dst)
        os.replace(partial, target)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot back up {source} to {target}: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return Backup(target, target.stat().st_size, revision, turns)


def _facts(connection: sqlite3.Connection) -> tuple[str | None, int]:
    tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    version = "SELECT version_num FROM alembic_version"
    revision = connection.execute(version).fetchone() if "alembic_version" in tables else None
    turns = connection.execute("SELECT count(*) FROM turns").fetchone()[0] if "turns" in tables else 0
    return (revision[0] if revision else None), turns
