"""Workers anywhere: a bot and a GPU worker that share nothing but the Redis URLs play every turn.

Each is a process of its own, started in a folder of its own as its working directory, with a data folder,
HOME and TMPDIR of its own, as the bot's small machine and a rented GPU machine would be. No blob setting:
clips and representations go through Redis with the results.
"""

from __future__ import annotations

import io
from pathlib import Path

import av

from tests.crowd import BotProcess, bot_argv, burst, count, crowd, discord_env, late, settle, setup_servers
from tests.discord_double import DiscordDouble
from tests.workers import machine, start_worker, worker_env

PLAYERS = 4


def frames(mp4: bytes) -> int:
    with av.open(io.BytesIO(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


async def test_a_bot_and_a_worker_sharing_only_the_redis_urls_post_every_turn_once_with_its_clip(
    redis_url: str, tmp_path: Path
) -> None:
    bot_machine, gpu_machine = tmp_path / "bot-machine", tmp_path / "gpu-machine"
    worker = start_worker({**worker_env(gpu_machine / "data", redis_url), **machine(gpu_machine)}, cwd=gpu_machine)
    shared = {k: v for k, v in worker.env.items() if k in ("ANIMEGAMER_BROKER_URL", "ANIMEGAMER_RESULT_BACKEND")}
    assert shared == {"ANIMEGAMER_BROKER_URL": redis_url, "ANIMEGAMER_RESULT_BACKEND": redis_url}
    guilds, players = crowd(PLAYERS, guilds=2)
    try:
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
    finally:
        worker.kill()
    outcome = count(double, jobs)
    log = bot.log.read_text(errors="replace")[-3000:]
    assert late(handles) == 0 and outcome.accepted == PLAYERS, log
    assert (outcome.delivered_once, outcome.lost, outcome.duplicates, outcome.told) == (PLAYERS, 0, 0, 0), log
    clips = [
        f.data for call in double.calls if call.method == "POST" for f in call.files if f.filename.endswith(".mp4")
    ]
    assert len(clips) == PLAYERS and all(frames(clip) == 17 for clip in clips)
    assert not (bot_machine / "data" / "blobs").exists() and not (gpu_machine / "data" / "blobs").exists()
