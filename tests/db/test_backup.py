"""`animegamer db backup PATH`: a consistent copy of the live SQLite game database, never a half-written one."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from animegamer.cli import main
from db.backup import BackupError, backup_sqlite
from db.migrate import head_revision, upgrade
from relay.settings import get_settings

TURN = "INSERT INTO turns (character_id, instruction, seed, model) VALUES (1, '{}', 1, 'toy')"


@pytest.fixture
def game(tmp_path: Path) -> Path:
    """A migrated game database with one committed turn."""
    path = tmp_path / "game.db"
    upgrade(f"sqlite+aiosqlite:///{path}")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO guilds (id, name) VALUES (1, 'g')")
        db.execute("INSERT INTO players (id, guild_id, user_id) VALUES (1, 1, 5)")
        db.execute("INSERT INTO characters (id, player_id, name, is_active) VALUES (1, 1, 'Qiqi', TRUE)")
        db.execute(TURN.format("committed"))
    return path


def turns_in(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [line for (line,) in db.execute("SELECT instruction FROM turns ORDER BY id")]


def test_a_backup_taken_while_a_writer_holds_a_transaction_has_the_committed_turns_and_not_the_open_one(
    game: Path, tmp_path: Path
) -> None:
    writer = sqlite3.connect(game, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")  # as the bot runs it
    writer.execute("BEGIN IMMEDIATE")
    writer.execute(TURN.format("half-made"))
    try:
        made = backup_sqlite(f"sqlite+aiosqlite:///{game}", tmp_path / "copy.db")
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert turns_in(made.path) == ["committed"]
    assert (made.revision, made.turns) == (head_revision(), 1)


def test_a_backup_has_a_turn_still_in_the_wal_which_a_plain_copy_of_the_file_loses(game: Path, tmp_path: Path) -> None:
    """The bot runs SQLite in WAL mode: a committed turn lives in game.db-wal until a checkpoint moves it into the
    file, so copying the file (what a backup script of cp or rsync does) loses it while the bot runs."""
    keeper = sqlite3.connect(game, isolation_level=None)  # the bot's connection: open, so nothing checkpoints at close
    keeper.execute("PRAGMA journal_mode=WAL")
    keeper.execute("PRAGMA wal_autocheckpoint=0")
    keeper.execute(TURN.format("in the wal"))
    writer = sqlite3.connect(game, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute(TURN.format("half-made"))  # and another write in flight
    try:
        shutil.copyfile(game, tmp_path / "plain.db")
        made = backup_sqlite(f"sqlite+aiosqlite:///{game}", tmp_path / "copy.db")
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        keeper.close()
    assert "in the wal" not in turns_in(tmp_path / "plain.db")
    assert turns_in(made.path) == ["committed", "in the wal"]


def test_a_backup_never_overwrites_a_file_and_leaves_none_behind_when_refused(game: Path, tmp_path: Path) -> None:
    target = tmp_path / "copy.db"
    target.write_bytes(b"an earlier backup")
    with pytest.raises(BackupError, match="already exists"):
        backup_sqlite(f"sqlite+aiosqlite:///{game}", target)
    assert target.read_bytes() == b"an earlier backup"
    assert not list(tmp_path.glob("*.partial"))


def test_a_missing_database_is_named_and_not_created(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match=r"no game database at .*nowhere\.db"):
        backup_sqlite(f"sqlite+aiosqlite:///{tmp_path}/nowhere.db", tmp_path / "copy.db")
    assert list(tmp_path.iterdir()) == []


def test_postgresql_is_sent_to_pg_dump_and_its_password_is_not_shown(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match="pg_dump") as refused:
        backup_sqlite("postgresql+asyncpg://game:hunter2@db.example/game", tmp_path / "copy.db")
    assert "hunter2" not in str(refused.value)


def test_the_command_says_what_it_copied_and_fails_with_one_line(
    game: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ANIMEGAMER_DATABASE_URL", f"sqlite+aiosqlite:///{game}")
    get_settings.cache_clear()
    try:
        assert main(["db", "backup", str(tmp_path / "copy.db")]) == 0
        assert f"Backed up 1 turns (schema {head_revision()}" in capsys.readouterr().out
        assert main(["db", "backup", str(tmp_path / "copy.db")]) == 1
        assert "already exists" in capsys.readouterr().err
    finally:
        get_settings.cache_clear()
