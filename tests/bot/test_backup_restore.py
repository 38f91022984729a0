"""A backup taken while a turn is being made restores, and the game goes on from it: that turn is posted once,
the next one is played (`animegamer db backup`, run as an operator runs it, beside the live bot)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from db.engine import sqlite_path
from db.models import Job, JobStatus
from tests.bot.conftest import running_bot, settings_beside, wait_for_db
from tests.bot.helpers import accepted
from tests.discord_double import member
from tests.workers import REPO, start_worker, worker_env

pytestmark = pytest.mark.slow  # a worker of its own, slow enough that the backup lands mid-turn

ALICE = member("alice")


async def act(double, motion: str) -> None:
    await accepted(await double.slash("act", {"motion": motion, "background": "day town"}, user=ALICE))


def back_up(database_url: str, target: Path) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANIMEGAMER_")}}
    env["ANIMEGAMER_DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "animegamer", "db", "backup", str(target)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def restore(backup: Path, database: Path) -> None:
    """As docs/operating.md says: the bot stopped, its database (and SQLite's side files) replaced by the copy."""
    for side in (database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")):
        side.unlink(missing_ok=True)
    shutil.copyfile(backup, database)


async def test_a_backup_taken_mid_turn_restores_and_the_game_goes_on(double, tmp_path: Path) -> None:
    worker = start_worker(worker_env(tmp_path / "worker", ANIMEGAMER_NUM_STEPS="300"))
    settings = settings_beside(worker, tmp_path)
    backup = tmp_path / "backup.db"
    try:
        async with running_bot(double, settings, worker):
            await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
            await act(double, "gently wave")
            await wait_for_db(settings, select(Job.sent_at), lambda r: r[0][0] is not None, timeout=60)
            made = await asyncio.to_thread(back_up, settings.database_url, backup)
            assert made.returncode == 0, made.stderr
            await wait_for_db(settings, select(Job.result_message_id), lambda r: r[0][0], timeout=120)
        with sqlite3.connect(backup) as copy:
            assert copy.execute("SELECT status FROM jobs").fetchall() in ([("queued",)], [("running",)])  # mid-turn

        database = sqlite_path(settings.database_url)
        assert database is not None
        restore(backup, database)
        async with running_bot(double, settings, worker):
            await wait_for_db(settings, select(Job.result_message_id), lambda r: r[0][0], timeout=120)
            await act(double, "quickly run")
            rows = await wait_for_db(
                settings,
                select(Job.status, Job.result_message_id).order_by(Job.id),
                lambda r: len(r) == 2 and all(message for _, message in r),
                timeout=120,
            )
            await asyncio.sleep(1.0)  # a few more ticks: nothing else is posted
    finally:
        worker.kill()
    assert [status for status, _ in rows] == [JobStatus.DONE, JobStatus.DONE]
    # The restored bot posted the first turn again with its nonce: Discord answered with the message it had made.
    clips = [m for m in double.messages() if any(a["filename"].endswith(".mp4") for a in m.attachments)]
    assert len(clips) == 2
