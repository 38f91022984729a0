"""Workers anywhere: a bot and a GPU worker that share nothing but the Redis URLs play every turn.

Each is a process of its own, started in a folder of its own as its working directory, with a data folder,
HOME and TMPDIR of its own, as the bot's small machine and a rented GPU machine would be. No blob setting:
clips and representations go through Redis with the results. Where the machine allows it, the worker runs in a
network namespace of its own too, reaching Redis over a veth pair (tests/netns.py).
"""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from pathlib import Path

import av
import pytest

from tests import tiers
from tests.crowd import BotProcess, bot_argv, burst, count, crowd, discord_env, late, settle, setup_servers
from tests.discord_double import DiscordDouble
from tests.netns import Namespace, network_namespace
from tests.redis_server import RedisServer
from tests.workers import Worker, machine, start_worker, worker_env

PLAYERS = 4


def frames(mp4: bytes) -> int:
    with av.open(io.BytesIO(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


async def play_a_burst(worker: Worker, bot_machine: Path, redis_url: str) -> None:
    """The bot in ``bot_machine`` with only the Redis URLs in common with ``worker``: every turn posted once."""
    shared = {k: v for k, v in worker.env.items() if k in ("ANIMEGAMER_BROKER_URL", "ANIMEGAMER_RESULT_BACKEND")}
    assert shared == {"ANIMEGAMER_BROKER_URL": redis_url, "ANIMEGAMER_RESULT_BACKEND": redis_url}
    guilds, players = crowd(PLAYERS, guilds=2)
    async with DiscordDouble(guilds, strict=True) as double:
        env = {
            **{k: v for k, v in worker.env.items() if not k.startswith(("ANIMEGAMER_", "HOME", "TMPDIR"))},
            **shared,
            **machine(bot_machine),
            **discord_env(double),
            "ANIMEGAMER_QUEUE": worker.env["ANIMEGAMER_QUEUE"],
            "ANIMEGAMER_MODEL": "tiny",
            "ANIMEGAMER_DELIVERY_POLL_SECONDS": "0.2",
        }
        bot = BotProcess(bot_argv(), env, bot_machine / "bot.log", cwd=bot_machine).start()
        try:
            await bot.ready(double, ("act", "start", "admin"))
            await setup_servers(double, guilds, players)
            handles = await burst(double, players)
            jobs = await settle(double, bot_machine / "data" / "animegamer.db", handles, timeout=180)
        finally:
            bot.stop()
    outcome = count(double, jobs)
    log = bot.log.read_text(errors="replace")[-3000:]
    assert late(handles) == 0 and outcome.accepted == PLAYERS, log
    assert (outcome.delivered_once, outcome.lost, outcome.duplicates, outcome.told) == (PLAYERS, 0, 0, 0), log
    clips = [
        f.data for call in double.calls if call.method == "POST" for f in call.files if f.filename.endswith(".mp4")
    ]
    assert len(clips) == PLAYERS and all(frames(clip) == 17 for clip in clips)


async def test_a_bot_and_a_worker_sharing_only_the_redis_urls_post_every_turn_once_with_its_clip(
    redis_url: str, tmp_path: Path
) -> None:
    bot_machine, gpu_machine = tmp_path / "bot-machine", tmp_path / "gpu-machine"
    worker = start_worker({**worker_env(gpu_machine / "data", redis_url), **machine(gpu_machine)}, cwd=gpu_machine)
    try:
        await play_a_burst(worker, bot_machine, redis_url)
    finally:
        worker.kill()
    assert not (bot_machine / "data" / "blobs").exists() and not (gpu_machine / "data" / "blobs").exists()


@pytest.fixture
@tiers.slow_fixture
def namespace() -> Iterator[Namespace]:
    with network_namespace() as space:
        yield space


async def test_a_worker_in_a_network_namespace_of_its_own_reaching_redis_over_a_veth_pair_plays_every_turn(
    namespace: Namespace, tmp_path: Path
) -> None:
    bot_machine, gpu_machine = tmp_path / "bot-machine", tmp_path / "gpu-machine"
    # Where the worker's machine reaches us, and off the loopback Redis wants a password, as a deployment has.
    server = RedisServer(tmp_path / "redis", host=namespace.host_address, password=secrets.token_hex(8))
    server.start()
    try:
        env = {**worker_env(gpu_machine / "data", server.url()), **machine(gpu_machine)}
        worker = start_worker(env, cwd=gpu_machine, prefix=namespace.prefix)
        try:
            await play_a_burst(worker, bot_machine, server.url())
        finally:
            worker.kill()
    finally:
        server.stop()
    for log in (bot_machine / "bot.log", worker.log):  # the URLs carry the password; no log line does
        assert server.password not in log.read_text(errors="replace"), log
