"""Every metric the dashboard and the alert rules query (deploy/monitoring/) is one that a live bot or a live worker
really exports: both are scraped over HTTP after a turn played through the loopback Discord, on Redis."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from db.models import Job
from tests.bot.conftest import running_bot, settings_beside, wait_for_db
from tests.bot.helpers import accepted
from tests.discord_double import member
from tests.scrape import free_port, scrape, scrape_when_up
from tests.test_monitoring import base_name, named_metrics, queries
from tests.workers import Worker

pytestmark = pytest.mark.slow

# Exported only where they apply, each checked where it does: GPU memory on a CUDA worker (tests/worker).
ONLY_ON_A_GPU = {"animegamer_gpu_memory_allocated_bytes", "animegamer_gpu_memory_peak_bytes"}


async def test_every_metric_the_dashboard_and_the_alerts_query_is_exported_by_a_live_bot_or_worker(
    double, redis_worker: Worker, tmp_path
) -> None:
    port = free_port()
    settings = settings_beside(redis_worker, tmp_path, metrics_port=port, metrics_address="127.0.0.1")
    alice = member("alice")
    async with running_bot(double, settings, redis_worker):
        await (await double.slash("start", {"character": "Qiqi"}, user=alice)).answer()
        await accepted(await double.slash("act", {"motion": "wave", "background": "day town"}, user=alice))
        await wait_for_db(settings, select(Job.result_message_id), lambda rows: rows and rows[0][0], timeout=90)
        bot = await asyncio.to_thread(scrape, port)
    worker = await asyncio.to_thread(scrape_when_up, int(redis_worker.env["ANIMEGAMER_WORKER_METRICS_PORT"]))
    exported = {name for name, _ in bot} | {name for name, _ in worker}
    exported |= {base_name(name) for name in exported}
    wanted = {name for expr in queries() for name in named_metrics(expr)}
    missing = wanted - exported - ONLY_ON_A_GPU
    assert not missing, sorted(missing)
    assert wanted >= ONLY_ON_A_GPU  # the exemption is for names the dashboard really uses
