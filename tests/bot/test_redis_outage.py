"""The bot through Redis restarts, as this machine's Redis runs (no persistence): nothing is lost, nothing blocks.

Each test runs a redis-server of its own and real worker processes on it.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
import redis.asyncio
from sqlalchemy import select

from db.models import Job, JobStatus
from tests.bot.conftest import running_bot, settings_beside, wait_for_db
from tests.bot.helpers import accepted, shown
from tests.discord_double import DiscordDouble, member
from tests.redis_server import RedisServer
from tests.workers import Worker, start_worker, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.redis]

ALICE = member("alice")
CLIP_POSTS = r"/channels/\d+/messages"


def bot_settings_for(worker: Worker, tmp_path: Path):
    return settings_beside(worker, tmp_path, broker_timeout=1.0)


def clip_posts(double: DiscordDouble) -> list:
    return [c for c in double.calls_to("POST", CLIP_POSTS) if any(f.filename.endswith(".mp4") for f in c.files)]


async def stored_result(url: str, task_id: str, timeout: float) -> None:
    """Wait until the worker has stored the task's result in Redis."""
    store = redis.asyncio.Redis.from_url(url)
    try:
        for _ in range(int(timeout / 0.2)):
            if b"SUCCESS" in (await store.get(f"celery-task-meta-{task_id}") or b""):
                return
            await asyncio.sleep(0.2)
    finally:
        await store.aclose()
    raise AssertionError(f"no result was stored for task {task_id} within {timeout}s")


async def act(double: DiscordDouble, motion: str):
    handle = await double.slash("act", {"motion": motion, "background": "day town"}, user=ALICE)
    await accepted(handle)
    return handle


async def test_the_bot_answers_while_redis_is_down_and_makes_the_turn_taken_meanwhile_once_it_is_back(double, tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    worker = start_worker(worker_env(tmp_path / "worker", server.url()))
    # Long enough that a call held on the loop until it times out stands out from a busy machine's scheduling,
    # which was seen to stall the loop 1.3 s with four test processes on two cores.
    settings = settings_beside(worker, tmp_path, broker_timeout=2.5)
    try:
        async with running_bot(double, settings, worker) as bot:
            await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
            await act(double, "gently wave")
            await wait_for_db(settings, select(Job.result_message_id), lambda r: r[0][0], timeout=90)

            bot.loop_watch.reset()
            await asyncio.to_thread(server.stop)  # in a thread: the test shares the bot's event loop
            status = await double.slash("status", user=ALICE)
            assert shown(await status.answer())["embeds"][0]["title"] == "Qiqi"  # commands without the queue answer
            during = await act(double, "quickly run")
            await double.wait_until(lambda: "not answering" in during.original.content, 15, "the queue-down note")
            await asyncio.sleep(3 * settings.broker_timeout)  # the supervisor keeps looking at a dead Redis

            await asyncio.to_thread(server.start)
            rows = await wait_for_db(
                settings,
                select(Job.status, Job.result_message_id).order_by(Job.id),
                lambda r: len(r) == 2 and all(message for _, message in r),
                timeout=120,
            )
            stall = bot.loop_watch.longest
    finally:
        worker.kill()
        server.stop()
    assert [status for status, _ in rows] == [JobStatus.DONE, JobStatus.DONE]
    assert len(clip_posts(double)) == 2
    # A call to the dead Redis made on the loop would hold it for the whole broker timeout; a busy machine's
    # scheduling alone stalls it far less.
    assert stall < settings.broker_timeout, f"the event loop stalled {stall:.2f}s while Redis was down and came back"


async def test_a_turn_queued_when_redis_restarts_and_forgets_it_is_sent_again_and_made_once(double, tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    first = start_worker(worker_env(tmp_path / "w1", server.url()))
    settings = bot_settings_for(first, tmp_path)
    first.kill(signal.SIGTERM)  # no worker: the turn's message waits in Redis
    second = None
    try:
        async with running_bot(double, settings, first):
            await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
            await act(double, "gently wave")
            await wait_for_db(settings, select(Job.sent_at), lambda r: r[0][0] is not None)
            await asyncio.to_thread(server.restart)  # the queued message is gone with it
            second = await asyncio.to_thread(start_worker, first.env)
            rows = await wait_for_db(
                settings, select(Job.status, Job.result_message_id, Job.attempts), lambda r: r[0][1], timeout=120
            )
            await asyncio.sleep(1.0)  # a few more ticks: nothing else is posted
    finally:
        if second is not None:
            second.kill()
        server.stop()
    ((status, _, attempts),) = rows
    assert status == JobStatus.DONE and attempts == 2  # sent, lost with Redis, sent again
    assert len(clip_posts(double)) == 1


async def test_a_turn_running_when_redis_restarts_is_finished_and_posted_once(double, tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    worker = start_worker(
        worker_env(tmp_path / "worker", server.url(), ANIMEGAMER_NUM_STEPS="1000", ANIMEGAMER_CLAIM_SECONDS="6")
    )
    settings = bot_settings_for(worker, tmp_path)
    try:
        async with running_bot(double, settings, worker):
            await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
            await act(double, "gently wave")
            await wait_for_db(settings, select(Job.status), lambda r: r[0][0] == JobStatus.RUNNING, timeout=60)
            await asyncio.to_thread(server.restart)  # its progress, claim and message are gone; its worker goes on
            rows = await wait_for_db(
                settings, select(Job.status, Job.result_message_id), lambda r: r[0][1], timeout=180
            )
            await asyncio.sleep(1.0)
    finally:
        worker.kill()
        server.stop()
    assert rows[0][0] == JobStatus.DONE
    assert len(clip_posts(double)) == 1


async def test_a_turn_made_while_the_bot_is_down_and_forgotten_by_a_restarted_redis_is_made_again_once(
    double, tmp_path
):
    server = RedisServer(tmp_path / "redis")
    server.start()
    worker = start_worker(
        worker_env(tmp_path / "worker", server.url(), ANIMEGAMER_NUM_STEPS="200", ANIMEGAMER_CLAIM_SECONDS="6")
    )
    settings = bot_settings_for(worker, tmp_path)
    try:
        async with running_bot(double, settings, worker):
            await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
            await act(double, "gently wave")
            ((task_id,),) = await wait_for_db(
                settings, select(Job.task_id).where(Job.status == JobStatus.RUNNING), bool, timeout=60
            )
        # The bot is down; its worker finishes the turn and stores the result, which no one reads.
        await stored_result(server.url(), task_id, timeout=120)
        await asyncio.to_thread(server.restart)  # and the result is gone with it
        async with running_bot(double, settings, worker):
            rows = await wait_for_db(
                settings, select(Job.status, Job.result_message_id, Job.attempts), lambda r: r[0][1], timeout=120
            )
            await asyncio.sleep(1.0)  # a few more ticks: nothing else is posted
    finally:
        worker.kill()
        server.stop()
    ((status, _, attempts),) = rows
    assert status == JobStatus.DONE and attempts == 2  # made, forgotten unread, made again
    assert len(clip_posts(double)) == 1
