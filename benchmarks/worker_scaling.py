"""What KEDA would ask for while a burst is played, and how long a worker scaled in mid-turn takes to drain.

    python benchmarks/worker_scaling.py [--players 50] [--steps 4]

- replicas: the real `animegamer bot` process on a PostgreSQL database of its own (the test server,
  ANIMEGAMER_TEST_POSTGRES_URL) and one tiny worker (random weights) on a Redis of the run's own; ``--players`` act at
  the same instant through the loopback Discord. Every second the scaling query of
  deploy/kubernetes/base/worker-scaling.yaml runs on the bot's database, and the replica count KEDA would ask for
  (ceil(value / targetQueryValue), within minReplicaCount..maxReplicaCount) is printed, until every turn is posted.
  One worker's throughput is what empties the queue here: the counts show how many workers the queue asked for, and
  for how long.
- drain: a worker whose turn crawls (tests.faulty_worker: the real pipeline, each of its 50 denoising steps taking
  0.6 s, about half a minute in all) is sent SIGTERM half-way through it (as a scale-in does): the seconds from
  SIGTERM to the process's exit, and whether the turn still ended done.

A measurement, not a test (tests/db/test_scaling_query.py checks the counts; tests/bot/test_faults.py the drain).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from sqlalchemy import text

from db.engine import make_engine
from db.migrate import upgrade
from tests.crowd import BotProcess, World, bot_argv, burst, crowd, discord_env, read_jobs, setup_servers
from tests.db.conftest import POSTGRES_URL, Postgres
from tests.discord_double import DiscordDouble
from tests.workers import start_worker, worker_env

ROOT = Path(__file__).resolve().parents[1]
SCALING = ROOT / "deploy" / "kubernetes" / "base" / "worker-scaling.yaml"


def scaled_object() -> dict:
    return next(doc for doc in yaml.safe_load_all(SCALING.read_text()) if doc["kind"] == "ScaledObject")


def replicas_for(value: float, scaled: dict) -> int:
    meta = scaled["spec"]["triggers"][0]["metadata"]
    if value <= float(meta["activationTargetQueryValue"]):
        return scaled["spec"]["minReplicaCount"]
    return min(scaled["spec"]["maxReplicaCount"], max(1, math.ceil(value / float(meta["targetQueryValue"]))))


async def replicas_during_a_burst(folder: Path, database: str, players: int, steps: int) -> None:
    scaled = scaled_object()
    query = text(scaled["spec"]["triggers"][0]["metadata"]["query"])
    world = World(folder / "world", workers=1, steps=steps)
    engine = make_engine(database)
    bot = None
    try:
        guilds, crowd_players = crowd(players, guilds=max(1, players // 25))
        async with DiscordDouble(guilds) as double:
            env = {**world.bot_env(double, folder / "bot" / "game.db"), **discord_env(double)}
            env["ANIMEGAMER_DATABASE_URL"] = database
            bot = BotProcess(bot_argv(), env, folder / "bot.log", cwd=folder).start()
            await bot.ready(double, ("act", "start", "admin"))
            await setup_servers(double, guilds, crowd_players)
            started = time.monotonic()
            await burst(double, crowd_players)
            timeline: list[tuple[float, int, int]] = []
            while True:
                async with engine.connect() as connection:
                    value = int(await connection.scalar(query))
                timeline.append((time.monotonic() - started, value, replicas_for(value, scaled)))
                jobs = await read_jobs(database)
                if len(jobs) == players and all(posted is not None for *_, posted in jobs):
                    break
                if time.monotonic() - started > 900:
                    print("replicas: gave up after 15 min")
                    break
                await asyncio.sleep(1.0)
        print(f"replicas asked during a burst of {players} turns, one tiny worker ({steps} steps):")
        print("  seconds  in flight  replicas")
        last = None
        for seconds, value, replicas in timeline:
            if (value, replicas) != last:
                print(f"  {seconds:7.1f}  {value:9d}  {replicas:8d}")
                last = (value, replicas)
        peak = max(replicas for *_, replicas in timeline)
        at_peak = sum(1 for *_, replicas in timeline if replicas == peak)
        print(f"  peak {peak} replicas for about {at_peak} s; all {players} posted after {timeline[-1][0]:.0f} s")
    finally:
        if bot is not None:
            bot.stop()
        await engine.dispose()
        world.close()


def drain(folder: Path) -> None:
    world_redis = World(folder / "drain", workers=0)
    line = "Character: Qiqi; Motion: crawl; Background: town."
    try:
        worker = start_worker(worker_env(folder / "drain-worker", world_redis.redis_url), "tests.faulty_worker")
        alone = time.monotonic()
        worker.send_turn(line, "drain-alone").get(timeout=600)
        turn_seconds = time.monotonic() - alone
        result = worker.send_turn(line, "drain")
        time.sleep(turn_seconds / 2)
        stopped = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        worker.proc.wait(600)
        drained = time.monotonic() - stopped
        outcome = "done" if result.get(timeout=30) is not None else "not done"
        print(f"drain: a turn takes {turn_seconds:.1f} s alone; SIGTERM half-way, the worker exited after")
        print(f"  {drained:.1f} s with its turn {outcome} (terminationGracePeriodSeconds must exceed the time limit)")
    finally:
        world_redis.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, default=50)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="animegamer-scaling-") as tmp:
        folder = Path(tmp)
        server = Postgres(POSTGRES_URL)
        if reason := server.unavailable():
            print(f"replicas: skipped ({reason})")
        else:
            name = server.new_database()
            try:
                upgrade(server.url_for(name))
                asyncio.run(replicas_during_a_burst(folder, server.url_for(name), args.players, args.steps))
            finally:
                server.drop(name)
        drain(folder)


if __name__ == "__main__":
    main()
