"""/healthz and /readyz beside /metrics: ready once the gateway is connected, the queue answers and the duties
tick; not ready, saying why, when the queue is down or a duty stops ticking."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from bot import health
from tests.bot.conftest import running_bot
from tests.bot.helpers import dead_queue, running_bot_on
from tests.scrape import free_port


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


async def ready_report(port: int) -> tuple[int, dict]:
    status, body = await asyncio.to_thread(get, port, "/readyz")
    return status, json.loads(body)


async def eventually(port: int, predicate, timeout: float = 10.0) -> tuple[int, dict]:
    for _ in range(int(timeout / 0.1)):
        status, report = await ready_report(port)
        if predicate(status, report):
            return status, report
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz never got there: {status} {report}")


async def test_a_connected_bot_whose_duties_tick_is_ready_and_alive(double, bot_settings) -> None:
    port = free_port()
    async with running_bot(double, bot_settings.model_copy(update={"metrics_port": port})):
        _, report = await eventually(port, lambda status, _: status == 200)
        assert await asyncio.to_thread(get, port, "/healthz") == (200, "alive\n")
        assert (await asyncio.to_thread(get, port, "/metrics"))[0] == 200  # still served beside them
    assert report["gateway"] == "connected" and report["queue"] == "answering" and report["stale"] == []


async def test_a_bot_whose_queue_does_not_answer_is_alive_but_not_ready(double, bot_settings) -> None:
    port = free_port()
    settings = bot_settings.model_copy(update={"metrics_port": port})
    async with running_bot_on(double, settings, dead_queue(settings)):
        status, report = await eventually(port, lambda _, report: report["queue"] == "not answering")
        assert (await asyncio.to_thread(get, port, "/healthz"))[0] == 200
    assert status == 503 and report["ready"] is False and report["gateway"] == "connected"


async def test_a_bot_whose_supervisor_stopped_ticking_is_not_ready_and_says_which(
    double, bot_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "STALE_SECONDS", 1.0)
    port = free_port()
    async with running_bot(double, bot_settings.model_copy(update={"metrics_port": port})) as bot:
        await eventually(port, lambda status, _: status == 200)
        await bot.supervisor.stop()  # as a loop that died would: no more ticks
        _, report = await eventually(port, lambda status, _: status == 503)
    assert report["stale"] == ["supervisor"] and report["database"] == "not reached lately"


async def test_a_bot_whose_shard_has_been_disconnected_for_seconds_is_not_ready_naming_the_shard(
    double, bot_settings
) -> None:
    """discord.py's is_ready() stays true while every shard reconnects: readiness must not."""
    port = free_port()
    async with running_bot(double, bot_settings.model_copy(update={"metrics_port": port})):
        await eventually(port, lambda status, _: status == 200)
        async with double.gateway_outage(0):
            _, report = await eventually(port, lambda status, _: status == 503, timeout=15)  # a few seconds down
        back, _ = await eventually(port, lambda status, _: status == 200, timeout=30)
    assert report["gateway"].startswith("shard 0 disconnected for ") and report["ready"] is False
    assert back == 200
