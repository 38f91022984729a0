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

from relay.redis_acl import bot_user, worker_user
from tests import tiers
from tests.certificates import make_certificates
from tests.crowd import BotProcess, bot_argv, burst, count, crowd, discord_env, late, settle, setup_servers
from tests.discord_double import DiscordDouble
from tests.netns import Namespace, network_namespace
from tests.redis_server import RedisServer
from tests.workers import Worker, machine, start_worker, worker_env

PLAYERS = 4


def shared_redis(worker: Worker) -> dict[str, str]:
    """The worker's Redis URLs, for a bot that shares them and nothing else."""
    return {k: v for k, v in worker.env.items() if k in ("ANIMEGAMER_BROKER_URL", "ANIMEGAMER_RESULT_BACKEND")}


def frames(mp4: bytes) -> int:
    with av.open(io.BytesIO(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


async def play_a_burst(worker: Worker, bot_machine: Path, redis: dict[str, str]) -> None:
    """The bot in ``bot_machine`` with only Redis in common with ``worker`` (``redis``: the bot's own Redis settings,
    its URLs and, where the worker has them, its user's password and TLS files): every turn posted once."""
    guilds, players = crowd(PLAYERS, guilds=2)
    guilds, players = crowd(PLAYERS, guilds=2)
    async with DiscordDouble(guilds, strict=True) as double:
        env = {
            **{k: v for k, v in worker.env.items() if not k.startswith(("ANIMEGAMER_", "HOME", "TMPDIR"))},
            **redis,
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
        await play_a_burst(worker, bot_machine, shared_redis(worker))
    finally:
        worker.kill()
    assert not (bot_machine / "data" / "blobs").exists() and not (gpu_machine / "data" / "blobs").exists()


@pytest.fixture
@tiers.slow_fixture
def namespace() -> Iterator[Namespace]:
    with network_namespace() as space:
        yield space


async def test_a_worker_in_a_network_namespace_of_its_own_reaches_redis_over_tls_as_the_workers_user(
    namespace: Namespace, tmp_path: Path
) -> None:
    """Off the loopback, as a rented GPU machine: Redis speaks only TLS, asks both machines for a client certificate
    and knows the bot and the workers as users of their own (relay/redis_acl.py); the worker's user is all the worker
    has, the bot's all the bot has, and every turn is played and posted once."""
    bot_machine, gpu_machine = tmp_path / "bot-machine", tmp_path / "gpu-machine"
    tls = make_certificates(tmp_path / "ca", addresses=(namespace.host_address,))
    queue, worker_password, bot_password = f"test-{secrets.token_hex(4)}", secrets.token_urlsafe(12), "b0t/+%41=#?@:"
    users = (worker_user("animegamer-worker", worker_password, queue), bot_user("animegamer-bot", bot_password, queue))
    server = RedisServer(
        tmp_path / "redis", host=namespace.host_address, password=secrets.token_hex(8), tls=tls,
        client_certificates=True, users=users,
    )  # fmt: skip
    server.start()
    where = f"rediss://{{user}}@{namespace.host_address}:{server.port}/0"
    certificates = {
        "ANIMEGAMER_REDIS_CA_FILE": str(tls.ca),
        "ANIMEGAMER_REDIS_CERT_FILE": str(tls.client_cert),
        "ANIMEGAMER_REDIS_KEY_FILE": str(tls.client_key),
    }
    try:
        env = {
            **worker_env(
                gpu_machine / "data", where.format(user="animegamer-worker"), ANIMEGAMER_QUEUE=queue,
                ANIMEGAMER_REDIS_PASSWORD=worker_password, **certificates,
            ),
            **machine(gpu_machine),
        }  # fmt: skip
        worker = start_worker(env, cwd=gpu_machine, prefix=namespace.prefix)
        try:
            bot_redis = {
                "ANIMEGAMER_BROKER_URL": where.format(user="animegamer-bot"),
                "ANIMEGAMER_RESULT_BACKEND": where.format(user="animegamer-bot"),
                "ANIMEGAMER_REDIS_PASSWORD": bot_password,
                **certificates,
            }
            await play_a_burst(worker, bot_machine, bot_redis)
        finally:
            worker.kill()
    finally:
        server.stop()
    for log in (bot_machine / "bot.log", worker.log):  # no log line holds a password, nor a refused command
        said = log.read_text(errors="replace")
        assert all(secret not in said for secret in (server.password, worker_password, bot_password)), log
        assert "NOPERM" not in said and "no permissions" not in said, said[-3000:]
