"""The bot through a Redis restart: it keeps answering, refuses new turns clearly, then recovers."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from db.models import Job
from tests.bot.conftest import running_bot, wait_for_db
from tests.discord_double import member
from tests.workers import settings_for, start_worker, worker_env

pytestmark = pytest.mark.slow

ALICE = member("alice")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis(port: int, folder: Path) -> None:
    # Our own server (not the shared one), persisting to disk so a restart keeps the queue.
    subprocess.run(
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(folder),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "yes",
        ],
        check=True,
        capture_output=True,
    )
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    raise AssertionError("redis-server did not start")


def stop_redis(port: int) -> None:
    with contextlib.suppress(redis.ConnectionError):  # the server closes the connection as it goes
        redis.Redis(port=port).shutdown()


async def act(double, motion: str):
    handle = await double.slash("act", {"motion": motion, "background": "day town"}, user=ALICE)
    await handle.response()
    return handle


async def test_the_bot_survives_a_redis_restart_and_delivers_again(double, tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed; `make test` installs it where it can")
    port = free_port()
    start_redis(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    worker = start_worker(worker_env(tmp_path / "worker", url))
    settings = settings_for(worker.env).model_copy(
        update={
            "database_url": f"sqlite+aiosqlite:///{tmp_path}/game.db",
            "data_dir": tmp_path,
            "delivery_poll_seconds": 0.1,
            "broker_timeout": 1.0,
        }
    )
    try:
        async with running_bot(double, settings, worker):
            await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).response()
            await act(double, "gently wave")
            await wait_for_db(settings, select(Job.result_message_id), lambda r: r[0][0], timeout=90)

            stop_redis(port)
            status = await double.slash("status", user=ALICE)
            assert (await status.response()).json["data"]["flags"] & 64  # commands without the queue still answer
            refused = await act(double, "quickly run")
            (followup,) = await refused.followups(timeout=30)
            assert "queue is unreachable" in followup.json["content"]

            start_redis(port, tmp_path)
            await asyncio.sleep(1.0)
            await act(double, "gently lie down")
            rows = await wait_for_db(
                settings,
                select(Job.status, Job.result_message_id),
                lambda r: len(r) == 3 and r[2][1] is not None,
                timeout=120,
            )
    finally:
        worker.kill()
        stop_redis(port)
    assert [status for status, _ in rows] == ["done", "failed", "done"]
