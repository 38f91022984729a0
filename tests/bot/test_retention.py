"""What the bot keeps and forgets: old clips (/history says so), a cancelled turn's result, the store's expired rows."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

from celery import states
from sqlalchemy import update

from bot.queue import TurnQueue
from bot.retention import BLOB_KEEP
from db.base import utcnow
from db.migrate import upgrade_async
from db.models import Job, Turn
from game.history import MAX_WINDOW
from relay.celery_app import make_celery
from relay.control import SqlControl
from relay.settings import Settings
from tests.bot.conftest import idle_settings, running_bot
from tests.bot.helpers import clip_path, db_session, idle_queue, private_text, running_bot_on, seed_turn
from tests.discord_double import member

ALICE = member("alice")


async def test_history_says_an_old_turns_clip_expired_once_retention_deleted_it(double, bot_settings, tmp_path):
    guild = double.guild
    async with running_bot_on(double, bot_settings, idle_queue(bot_settings, tmp_path)) as bot:
        jobs = [await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, done=True) for _ in range(6)]
        async with db_session(bot_settings) as session:
            await session.execute(update(Turn).values(created_at=utcnow() - timedelta(days=45)))
        await bot.retention.run_once()
        text = private_text(await (await double.slash("history", user=ALICE)).answer())
    lines = text.split("\n")  # newest first
    assert [line.endswith("(clip expired)") for line in lines] == [False] * MAX_WINDOW + [True]
    assert not clip_path(bot_settings, guild.id, jobs[0]).exists()
    assert all(clip_path(bot_settings, guild.id, job).exists() for job in jobs[1:])


async def test_a_bot_started_from_another_folder_finds_the_clips_recorded_before(double, tmp_path, monkeypatch):
    guild, first = double.guild, tmp_path / "first"
    first.mkdir()
    monkeypatch.chdir(first)
    before = idle_settings(Path("data"), database_url=f"sqlite+aiosqlite:///{tmp_path}/game.db")  # the default
    await upgrade_async(before.database_url)
    jobs = [await seed_turn(before, guild.id, guild.channel.id, ALICE.id, done=True) for _ in range(MAX_WINDOW + 1)]
    async with db_session(before) as session:
        await session.execute(update(Turn).values(created_at=utcnow() - timedelta(days=45)))
    clip = clip_path(before, guild.id, jobs[0])
    assert clip.is_file()

    monkeypatch.chdir(tmp_path)  # a service manager starts it elsewhere, naming the same data folder
    after = before.model_copy(update={"data_dir": first / "data"})
    async with running_bot(double, after) as bot:
        swept = await bot.retention.run_once()
    assert (swept.clips, swept.files_missing) == (1, [])
    assert not clip.exists()


async def test_a_sweep_deletes_blobs_older_than_any_turn_can_wait_for_them(double, bot_settings, tmp_path):
    async with running_bot_on(double, bot_settings, idle_queue(bot_settings, tmp_path)) as bot:
        old, new = bot.blobs.put(b"old representation"), bot.blobs.put(b"new one")
        long_ago = time.time() - (BLOB_KEEP + timedelta(hours=1)).total_seconds()
        os.utime(bot.blobs.path_for(old.sha256), (long_ago, long_ago))
        await bot.retention.run_once()
        assert not bot.blobs.path_for(old.sha256).exists()
        assert bot.blobs.get(new) == b"new one"


async def test_a_cancelled_turns_stored_result_is_forgotten_once_its_workers_are_told(double, bot_settings, tmp_path):
    guild = double.guild
    queue = idle_queue(bot_settings, tmp_path)
    async with running_bot_on(double, bot_settings, queue):
        job_id = await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id)
        async with db_session(bot_settings) as session:  # its task went out, and its worker stored a whole result
            job = await session.get_one(Job, job_id)
            job.sent_at, task_id = utcnow(), job.task_id
        queue.backend.store_result(task_id, {"mp4": "a clip's worth of bytes"}, states.SUCCESS)
        await (await double.slash("cancel", user=ALICE)).answer()
        for _ in range(100):
            if queue.backend.get_task_meta(task_id, cache=False)["status"] == states.PENDING:
                break
            await asyncio.sleep(0.05)
    assert queue.backend.get_task_meta(task_id, cache=False)["status"] == states.PENDING  # forgotten


async def test_the_embedded_result_store_drops_expired_results_claims_and_cancel_marks(tmp_path: Path):
    results = tmp_path / "results.db"
    app = make_celery(Settings(data_dir=tmp_path, result_backend=f"db+sqlite:///{results}"))
    app.backend.store_result("old", {"mp4": "bytes"}, states.SUCCESS)
    app.backend.store_result("new", {"mp4": "bytes"}, states.SUCCESS)
    control = SqlControl(f"sqlite:///{results}", timeout=3)
    control.cancel("old", keep=-1)  # its keep time is over
    control.cancel("new", keep=3600)
    control.end("old", "a worker", keep=-1)
    with sqlite3.connect(results) as con:
        con.execute("UPDATE celery_taskmeta SET date_done = datetime('now', '-2 days') WHERE task_id = 'old'")
    queue = TurnQueue(app, timeout=3)
    try:
        assert await queue.clean_store() == 2
    finally:
        queue.close()
    with sqlite3.connect(results) as con:
        assert con.execute("SELECT task_id FROM celery_taskmeta").fetchall() == [("new",)]
    assert control.cancelled("new") and not control.cancelled("old")
    control.close()
