"""Two bot processes, one game: on one PostgreSQL and one Redis, each in a folder of its own, one worker, every
turn is posted exactly once with its clip whichever process applies its result (issue 34, measured here).

Both processes connect the same shard, as during a rolling deploy: the loopback Discord hands each interaction to
the newer session, and both run every background duty.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from db.migrate import upgrade
from tests.crowd import CLIP, BotProcess, bot_argv, burst, crowd, discord_env, late, settle, setup_servers
from tests.db.conftest import POSTGRES_URL, Postgres
from tests.discord_double import DiscordDouble
from tests.workers import machine, start_worker, worker_env

pytestmark = pytest.mark.slow  # two bot processes, a worker, PostgreSQL and Redis

PLAYERS = 6


@pytest.fixture
def fleet_database() -> Iterator[str]:
    server = Postgres(POSTGRES_URL)
    if reason := server.unavailable():
        pytest.skip(reason)
    name = server.new_database()
    upgrade(server.url_for(name))  # as the operator does (`animegamer db upgrade`) before starting the bots
    yield server.url_for(name)
    server.drop(name)


def clip_messages(double: DiscordDouble) -> dict[int, int]:
    """Job id -> how many messages in the channels carry its clip (a post Discord deduplicated by its nonce is one)."""
    seen: dict[int, int] = {}
    for message in double.messages():
        for attachment in message.attachments:
            found = CLIP.fullmatch(attachment["filename"])
            if found:
                seen[int(found[1])] = seen.get(int(found[1]), 0) + 1
    return seen


async def test_two_bot_processes_on_one_database_post_every_turn_exactly_once(
    redis_url: str, tmp_path: Path, fleet_database: str
) -> None:
    gpu = tmp_path / "gpu-machine"
    worker = start_worker({**worker_env(gpu / "data", redis_url), **machine(gpu)}, cwd=gpu)
    guilds, players = crowd(PLAYERS, guilds=2)
    bots: list[BotProcess] = []
    try:
        async with DiscordDouble(guilds, strict=True) as double:
            env = {
                **{k: v for k, v in worker.env.items() if not k.startswith(("ANIMEGAMER_", "HOME", "TMPDIR"))},
                **discord_env(double),
                "ANIMEGAMER_BROKER_URL": redis_url,
                "ANIMEGAMER_RESULT_BACKEND": redis_url,
                "ANIMEGAMER_DATABASE_URL": fleet_database,
                "ANIMEGAMER_QUEUE": worker.env["ANIMEGAMER_QUEUE"],
                "ANIMEGAMER_MODEL": "tiny",
                "ANIMEGAMER_DELIVERY_POLL_SECONDS": "0.2",
            }
            for name in ("old", "new"):  # a rolling deploy: the new bot starts before the old one stops
                folder = tmp_path / f"{name}-bot"
                bot = BotProcess(bot_argv(), {**env, **machine(folder)}, folder / "bot.log", cwd=folder).start()
                bots.append(bot)
                await bot.ready(double, ("act", "start", "admin"))
            await setup_servers(double, guilds, players)
            handles = await burst(double, players)
            jobs = await settle(double, fleet_database, handles, timeout=180)
    finally:
        for bot in bots:
            bot.stop()
        worker.kill()
    logs = "\n".join(bot.log.read_text(errors="replace")[-2000:] for bot in bots)
    posted = clip_messages(double)
    assert late(handles) == 0 and len(jobs) == PLAYERS, logs
    assert sorted(posted) == sorted(job_id for job_id, *_ in jobs), logs  # none lost
    assert set(posted.values()) == {1}, (posted, logs)  # none twice
