"""What an operator sees of the bot: its Prometheus endpoint after real play through the loopback Discord.

Each turn's end is counted once, by outcome, whoever moved it; the queue's depth follows the jobs the
supervisor reads; every interaction's first answer is timed under its command's name.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis
from sqlalchemy import select

from bot.app import AnimeGamerBot
from bot.queue import TurnQueue
from db.models import Job, JobStatus
from relay.celery_app import make_celery
from relay.settings import Settings
from tests.bot.conftest import idle_settings, running_bot, settings_beside, wait_for_db
from tests.bot.helpers import accepted, idle_queue, running_bot_on, shown
from tests.discord_double import DiscordDouble, member
from tests.redis_server import RedisServer
from tests.scrape import free_port, scrape, value
from tests.workers import Worker

pytestmark = pytest.mark.slow

ALICE = member("alice")
WAVE = {"motion": "gently wave", "background": "day town"}
CLIP_POSTS = r"/channels/\d+/messages"


def turns(bot: AnimeGamerBot) -> dict[str, float]:
    """Turns ended so far, by outcome, as the bot's registry holds them."""
    registry = bot.metrics.registry
    return {
        outcome: registry.get_sample_value("animegamer_turns_total", {"outcome": outcome})
        for outcome in ("done", "failed", "cancelled", "expired")
    }


def only(outcome: str) -> dict[str, float]:
    return {name: 1.0 if name == outcome else 0.0 for name in ("done", "failed", "cancelled", "expired")}


def sample(bot: AnimeGamerBot, name: str, **labels: str) -> float | None:
    return bot.metrics.registry.get_sample_value(name, labels)


async def play(double: DiscordDouble) -> None:
    await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
    await accepted(await double.slash("act", WAVE, user=ALICE))


async def ended(settings: Settings, status: JobStatus) -> None:
    await wait_for_db(settings, select(Job.status), lambda rows: rows and rows[0][0] == status, timeout=90)


async def until(predicate, what: str, timeout: float = 15.0) -> None:
    """Wait for the supervisor's next ticks to show something (it sets gauges each tick)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"never saw {what}"
        await asyncio.sleep(0.05)


async def test_the_endpoint_after_a_played_turn_shows_each_first_answer_timed_and_the_turn_done_once(
    double, worker_settings, sqlite_worker: Worker
):
    port = free_port()
    settings = worker_settings.model_copy(update={"metrics_port": port, "metrics_address": "127.0.0.1"})
    async with running_bot(double, settings, sqlite_worker):
        await play(double)
        ((job_id, message_id),) = await wait_for_db(
            settings, select(Job.id, Job.result_message_id), lambda rows: rows and rows[0][1], timeout=90
        )
        details = await double.button(message_id, f"ag:turn:{job_id}:details", user=ALICE)
        assert "seed" in shown(await details.response())["content"]
        samples = await asyncio.to_thread(scrape, port)
    answered = "animegamer_interaction_first_answer_seconds_count"
    assert value(samples, answered, command="start") == 1
    assert value(samples, answered, command="act") == 1
    assert value(samples, answered, command="ag:turn:#:details") == 1  # one series per button, not per job
    assert value(samples, "animegamer_interaction_first_answer_seconds_bucket", command="act", le="+Inf") == 1
    assert value(samples, "animegamer_turns_total", outcome="done") == 1
    assert value(samples, "animegamer_turns_total", outcome="failed") == 0


async def test_a_turn_waiting_for_a_worker_counts_in_its_queue_until_it_is_cancelled(double, bot_settings, tmp_path):
    settings = bot_settings
    queued = {"queue": settings.queue, "status": "queued"}
    async with running_bot_on(double, settings, idle_queue(settings, tmp_path)) as bot:  # no worker takes it
        await play(double)
        await until(lambda: sample(bot, "animegamer_queue_jobs", **queued) == 1, "the turn queued")
        await (await double.slash("cancel", user=ALICE)).answer()
        await until(lambda: sample(bot, "animegamer_queue_jobs", **queued) == 0, "the queue emptied")
        await asyncio.sleep(0.5)  # ticks go on; nothing counts the turn again
        assert turns(bot) == only("cancelled")


async def test_a_turn_no_worker_picked_up_in_time_is_counted_expired_once(double, bot_settings, tmp_path):
    settings = bot_settings.model_copy(update={"pickup_timeout": 1.0})
    async with running_bot_on(double, settings, idle_queue(settings, tmp_path)) as bot:
        await play(double)
        await ended(settings, JobStatus.EXPIRED)
        await asyncio.sleep(0.5)
        assert turns(bot) == only("expired")


async def test_a_turn_that_fails_is_counted_failed_once(sqlite_worker, tmp_path):
    # The bot looks for the worker's clips in a blob folder of its own: the result cannot be read, the turn fails.
    settings = settings_beside(sqlite_worker, tmp_path, blob_dir=tmp_path / "not-the-workers")
    async with DiscordDouble() as double, running_bot(double, settings, sqlite_worker) as bot:
        await play(double)
        await ended(settings, JobStatus.FAILED)
        await asyncio.sleep(0.5)
        assert turns(bot) == only("failed")


async def test_each_post_retried_after_a_passing_failure_is_counted(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker) as bot:
        double.fail("POST", CLIP_POSTS, status=503, times=2)
        await play(double)
        await wait_for_db(worker_settings, select(Job.result_message_id), lambda rows: rows and rows[0][0], timeout=90)
        assert sample(bot, "animegamer_delivery_retries_total") == 2
        assert sample(bot, "animegamer_delivery_undeliverable_total") == 0


async def test_a_post_refused_for_good_is_counted_undeliverable_not_retried(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker) as bot:
        double.fail("POST", CLIP_POSTS, status=403, code=50013, times=None)
        await play(double)
        await wait_for_db(
            worker_settings, select(Job.result_message_id), lambda rows: rows and rows[0][0] is not None, timeout=90
        )
        await until(lambda: sample(bot, "animegamer_delivery_undeliverable_total") == 1, "the post given up")
        assert sample(bot, "animegamer_delivery_retries_total") == 0


async def test_the_log_has_one_line_for_each_step_of_a_turn_naming_its_job_and_not_its_words(
    double, worker_settings, sqlite_worker: Worker, caplog
):
    caplog.set_level(logging.INFO)
    async with running_bot(double, worker_settings, sqlite_worker):
        await play(double)
        ((job_id, task_id, _),) = await wait_for_db(
            worker_settings, select(Job.id, Job.task_id, Job.result_message_id), lambda rows: rows and rows[0][2]
        )
    said = [record.getMessage() for record in caplog.records]
    for step in ("queued", "sent to", "started", "done in", "posted as"):
        assert sum(line.startswith(f"job {job_id} {step}") for line in said) == 1, (step, said)
    assert sqlite_worker.said(f"started (task {task_id})") == 1  # the worker's line names the job too
    assert not [line for line in said if WAVE["motion"] in line]


async def test_a_turn_no_worker_takes_shows_its_wait_growing_on_a_queue_with_no_worker(double, bot_settings, tmp_path):
    settings = bot_settings

    def waited() -> float:
        return sample(bot, "animegamer_queue_oldest_wait_seconds", queue=settings.queue) or 0.0

    async with running_bot_on(double, settings, idle_queue(settings, tmp_path)) as bot:
        assert waited() == 0
        await play(double)
        await until(lambda: waited() > 0, "a wait")
        first = waited()
        await until(lambda: waited() >= first + 1, "the wait grow")
        assert sample(bot, "animegamer_queue_workers", queue=settings.queue) == 0


async def test_a_live_worker_is_counted_on_its_queue_and_a_lost_shard_reads_disconnected_until_it_is_back(
    double, worker_settings, sqlite_worker
):
    async with running_bot(double, worker_settings, sqlite_worker) as bot:
        assert sample(bot, "animegamer_queue_workers", queue=worker_settings.queue) == 1
        assert sample(bot, "animegamer_shard_disconnected_seconds", shard="0") == 0
        async with double.gateway_outage(0):
            await until(lambda: sample(bot, "animegamer_shard_disconnected_seconds", shard="0") >= 1, "the outage")
        await until(lambda: sample(bot, "animegamer_shard_disconnected_seconds", shard="0") == 0, "it back")


async def test_a_clip_the_store_refuses_counts_a_failed_put(sqlite_worker, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    settings = settings_beside(sqlite_worker, tmp_path, clip_dir=tmp_path / "a-file" / "clips")
    async with DiscordDouble() as double, running_bot(double, settings, sqlite_worker) as bot:
        assert sample(bot, "animegamer_clip_store_failures_total", operation="put") == 0
        await play(double)
        await until(lambda: sample(bot, "animegamer_clip_store_failures_total", operation="put") >= 1, "a put", 90)


async def test_a_redis_brokers_memory_and_its_limit_are_exported(double, redis_worker, tmp_path):
    settings = settings_beside(redis_worker, tmp_path)
    async with running_bot(double, settings, redis_worker) as bot:
        used = sample(bot, "animegamer_broker_memory_used_bytes")
        limit = sample(bot, "animegamer_broker_memory_max_bytes")
    info = redis.Redis.from_url(settings.broker_url).info("memory")
    assert used is not None and used > 0 and limit == info["maxmemory"]


async def test_a_broker_that_will_not_tell_its_memory_is_left_out_and_the_queue_keeps_answering(tmp_path):
    """A Redis user whose ACL denies INFO (it is in @dangerous): the memory is simply not exported, and the queue is
    not cooled down for it (it would fail the next tick's look and send)."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        admin = redis.Redis.from_url(server.url())
        admin.execute_command("ACL", "SETUSER", "default", "on", "nopass", "~*", "&*", "+@all", "-info")
        settings = idle_settings(tmp_path, broker_url=server.url(0), result_backend=server.url(1))
        queue = TurnQueue(make_celery(settings), timeout=2.0)
        try:
            assert await queue.broker_memory() is None
            assert queue.available
            await queue.ping()  # still answers
        finally:
            queue.close()
    finally:
        server.stop()
