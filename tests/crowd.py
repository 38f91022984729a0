"""A crowd of players against the real bot process, for benchmarks/load_players.py and tests/bot/test_load.py.

The bot runs as `animegamer bot` in a process of its own (for the floor, benchmarks/bare_bot.py), pointed
at the loopback Discord double in this process through DISCORD_API_BASE and DISCORD_GATEWAY_URL, as an
operator would point it at a proxy. Workers are `animegamer worker` processes (tests.workers) on a Redis of
the run's own (tests.redis_server), so the bytes it is sent are the run's alone. Players act through the
double exactly as Discord sends interactions, and everything is counted from outside:

- the first answer to each command: the double times it from the INTERACTION_CREATE it sent to the
  callback's arrival; after 3 s Discord would have answered 10062 (``late``);
- each accepted turn (a job in the game database): posted once, posted more than once (a duplicate),
  failed or expired with the player told, or lost (none of these by the end);
- the bot process's peak memory (VmHWM), and what Redis was sent (INFO total_net_input_bytes).
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
from sqlalchemy import select

from db.engine import make_engine, make_sessionmaker
from db.models import Job
from game.jobs import FINAL, JobStatus
from tests import tiers
from tests.discord_double import DiscordDouble, Guild, InteractionHandle, Member, member
from tests.redis_server import RedisServer
from tests.workers import REPO, Worker, start_worker, worker_env

WAVE = {"motion": "gently wave", "background": "day town"}
READY_SECONDS = 90
CLIP = re.compile(r"turn_(\d+)\.mp4")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank: p99 of 50 values is the largest but none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


@dataclass(frozen=True)
class Player:
    member: Member
    guild: Guild


def crowd(players: int, guilds: int, prefix: str = "player") -> tuple[list[Guild], list[Player]]:
    """``players`` players spread evenly over ``guilds`` servers, each server with one channel."""
    made = [Guild(name=f"{prefix} server {i}") for i in range(guilds)]
    return made, [Player(member(f"{prefix}{i}"), made[i % guilds]) for i in range(players)]


class BotProcess:
    """A bot in a process of its own, its output in a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> None:
        self.argv, self.env, self.log, self.cwd = argv, env, log, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BotProcess:
        tiers.starting("a bot process")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd)
        return self

    async def ready(self, double: DiscordDouble, commands: Iterable[str] = ("act",)) -> None:
        """Until the bot has synced its commands and said it is ready (it logs 'ready as ...')."""
        deadline = time.monotonic() + READY_SECONDS
        wanted = set(commands)
        while not (
            b"ready as" in self.log.read_bytes() and wanted <= {c["name"] for c in double.commands.get(None, [])}
        ):
            assert self.proc is not None
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the bot did not get ready:\n{self.log.read_text(errors='replace')[-3000:]}")
            await asyncio.sleep(0.1)

    def peak_rss_mb(self) -> float:
        """The process's peak resident memory so far, from /proc (Linux)."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1]) / 1024

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def bot_argv() -> list[str]:
    return [sys.executable, "-m", "animegamer", "bot"]


def bare_argv() -> list[str]:
    return [sys.executable, str(REPO / "benchmarks" / "bare_bot.py")]


def discord_env(double: DiscordDouble) -> dict[str, str]:
    return {
        "DISCORD_TOKEN": "crowd-token",
        "DISCORD_API_BASE": double.api_base,
        "DISCORD_GATEWAY_URL": double.gateway_url,
        "PYTHONUNBUFFERED": "1",
    }


class World:
    """A Redis of the run's own and ``workers`` tiny workers (``steps`` denoising steps) on one queue."""

    def __init__(self, folder: Path, workers: int = 1, steps: int = 4, redis_url: str | None = None) -> None:
        self.folder = folder
        self.server: RedisServer | None = None
        if redis_url is None:
            self.server = RedisServer(folder / "redis")
            self.server.start()
            redis_url = self.server.url()
        self.redis_url = redis_url
        # Redis is all the bot and the workers share: clips and representations go through it too.
        self.env = worker_env(folder / "workers", redis_url, ANIMEGAMER_NUM_STEPS=str(steps))
        self.workers: list[Worker] = []
        self.add_workers(workers)

    @classmethod
    def around(cls, worker: Worker, folder: Path) -> World:
        """A world made of a running worker (the test session's) and the Redis it uses."""
        world = cls.__new__(cls)
        world.folder, world.server, world.workers = folder, None, []
        world.redis_url = worker.env["ANIMEGAMER_BROKER_URL"]
        world.env = dict(worker.env)
        return world

    def add_workers(self, count: int) -> None:
        for _ in range(count):
            self.workers.append(start_worker(self.env))

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.kill(signal.SIGTERM)
        self.workers.clear()

    def bot_env(self, double: DiscordDouble, database: Path, **settings: str) -> dict[str, str]:
        """The bot's environment: the workers' queue and Redis, a database and clip folder of its own."""
        env = dict(self.env)
        env.update(discord_env(double))
        env.update(
            ANIMEGAMER_DATA_DIR=str(database.parent),
            ANIMEGAMER_DATABASE_URL=f"sqlite+aiosqlite:///{database}",
        )
        env.update({f"ANIMEGAMER_{name.upper()}": value for name, value in settings.items()})
        return env

    def redis_bytes_in(self) -> int:
        """Bytes Redis has been sent by every client since it started."""
        client = redis.Redis.from_url(self.redis_url)
        try:
            return int(client.info("stats")["total_net_input_bytes"])
        finally:
            client.close()

    def close(self) -> None:
        self.stop_workers()
        if self.server is not None:
            self.server.stop()


# -- driving players ----------------------------------------------------------------------------------


async def each_answered(double: DiscordDouble, handles: Sequence[InteractionHandle], timeout: float = 60.0) -> None:
    """Until every interaction got its first callback, or its deadline passed without one."""
    deadline = time.monotonic() + timeout
    while not all(h.first_callback_seconds is not None for h in handles) and time.monotonic() < deadline:
        if all(h.first_callback_seconds is not None or h.late for h in handles):
            break
        await asyncio.sleep(0.05)


async def in_batches(coros: Iterable, size: int = 50) -> list:
    """Run coroutines ``size`` at a time (setup that is not measured need not be a burst)."""
    pending, done = list(coros), []
    for start in range(0, len(pending), size):
        done += await asyncio.gather(*pending[start : start + size])
    return done


async def setup_servers(double: DiscordDouble, guilds: Sequence[Guild], players: Sequence[Player]) -> None:
    """Each server's owner lifts the caps a burst would hit; each player picks a character."""

    async def admin(guild: Guild) -> None:
        handle = await double.slash(
            "admin quota", {"turns_per_hour": 1000, "max_queued": 1000}, user=guild.owner, guild_id=guild.id
        )
        await handle.answer(timeout=60)

    async def start(player: Player) -> None:
        handle = await double.slash("start", {"character": "Qiqi"}, user=player.member, guild_id=player.guild.id)
        await handle.answer(timeout=60)

    await in_batches(admin(g) for g in guilds)
    await in_batches(start(p) for p in players)


async def act(double: DiscordDouble, player: Player, options: dict | None = None) -> InteractionHandle:
    return await double.slash("act", options or WAVE, user=player.member, guild_id=player.guild.id)


async def burst(
    double: DiscordDouble, players: Sequence[Player], options: dict | None = None
) -> list[InteractionHandle]:
    """Every player acts at the same instant."""
    return list(await asyncio.gather(*(act(double, p, options) for p in players)))


async def steady(
    double: DiscordDouble, players: Sequence[Player], rate: float, seconds: float, seed: int = 1
) -> list[InteractionHandle]:
    """Players act one at a time, ``rate`` a second on average (Poisson arrivals), for ``seconds``."""
    rng, tasks = random.Random(seed), []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tasks.append(asyncio.create_task(act(double, rng.choice(players))))
        await asyncio.sleep(rng.expovariate(rate))
    return list(await asyncio.gather(*tasks))


class Prober:
    """A player who asks /status every ``every`` seconds while it runs: what the others see meanwhile."""

    def __init__(self, double: DiscordDouble, players: Sequence[Player], every: float = 0.2) -> None:
        self.double, self.players, self.every = double, players, every
        self.handles: list[InteractionHandle] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        rng = random.Random(7)
        while True:
            player = rng.choice(self.players)
            self.handles.append(await self.double.slash("status", user=player.member, guild_id=player.guild.id))
            await asyncio.sleep(self.every)

    def __enter__(self) -> Prober:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


# -- counting -------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What happened to the turns of one run, from the game database and the double's records."""

    accepted: int = 0
    delivered_once: int = 0
    duplicates: int = 0
    told: int = 0  # failed or expired, which the player was told of
    lost: int = 0  # accepted, never posted, not final (or final without a notice) at the end
    last_clip_at: float = 0.0  # time.monotonic() of the last clip's post
    posted_at: dict[int, float] = field(default_factory=dict)  # job id -> when its clip was posted
    jobs: list[tuple] = field(default_factory=list)  # (job id, status, user id, guild id)


async def read_jobs(database: Path | str) -> list[tuple]:
    """The jobs of a SQLite file, or of any database by its URL."""
    engine = make_engine(database if isinstance(database, str) else f"sqlite+aiosqlite:///{database}")
    try:
        async with make_sessionmaker(engine)() as session:
            rows = await session.execute(select(Job.id, Job.status, Job.user_id, Job.guild_id, Job.result_message_id))
            return [tuple(row) for row in rows]
    finally:
        await engine.dispose()


class Answers:
    """When each interaction got its real answer (a message, or the first followup or edit after a defer),
    read from the double's records incrementally: a crowd makes thousands of calls."""

    def __init__(self, double: DiscordDouble) -> None:
        self.double, self.seen, self.at = double, 0, dict[str, float]()
        self.text: dict[str, str] = {}  # interaction token -> its answer's text

    def update(self) -> dict[str, float]:
        """Interaction token -> when its answer arrived (time.monotonic())."""
        calls = self.double.calls
        for call in calls[self.seen :]:
            parts = call.path.split("/")
            if call.status >= 300 or len(parts) < 4:
                continue
            body = call.json or {}
            if call.method == "POST" and parts[1] == "interactions" and body.get("type") != 5:
                token, content = parts[3], (body.get("data") or {}).get("content")  # a defer is not yet an answer
            elif parts[1] == "webhooks" and call.method in ("POST", "PATCH"):
                token, content = parts[3], body.get("content")
            else:
                continue
            if token not in self.at:
                self.at[token], self.text[token] = call.at, content or ""
        self.seen = len(calls)
        return self.at

    def refusals(self, handles: Iterable[InteractionHandle]) -> dict[str, int]:
        """What the players not given a turn were told, and how many each (a turn's answer starts with 🎬)."""
        self.update()
        told: dict[str, int] = {}
        for handle in handles:
            text = self.text.get(handle.token, "(no answer)")
            if not text.startswith("🎬"):
                told[text] = told.get(text, 0) + 1
        return told

    def seconds(self, handles: Iterable[InteractionHandle]) -> list[float]:
        """Each interaction's time from dispatch to its real answer (inf: none)."""
        at = self.update()
        return [at[h.token] - h.dispatched_at if h.token in at else float("inf") for h in handles]


async def settle(
    double: DiscordDouble, database: Path | str, handles: Sequence[InteractionHandle], timeout: float
) -> list[tuple]:
    """Until every interaction was answered, every job is final and every done one posted (or given up on)."""
    deadline, answers = time.monotonic() + timeout, Answers(double)
    while True:
        answered = answers.update()
        jobs = await read_jobs(database)
        if all(h.token in answered or h.late for h in handles) and all(
            s in FINAL and (s != JobStatus.DONE or posted is not None) for _, s, _, _, posted in jobs
        ):
            break
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.0)  # a few more ticks: anything posted twice would show now
    return await read_jobs(database)


def count(double: DiscordDouble, jobs: list[tuple]) -> Outcome:
    outcome = Outcome(accepted=len(jobs), jobs=[row[:4] for row in jobs])
    times: dict[int, int] = {}
    for call in double.calls:
        if call.method != "POST" or not call.path.startswith("/channels/") or call.status != 200:
            continue
        for upload in call.files:
            found = CLIP.fullmatch(upload.filename)
            if found:
                job_id = int(found[1])
                times[job_id] = times.get(job_id, 0) + 1
                outcome.posted_at.setdefault(job_id, call.at)
                outcome.last_clip_at = max(outcome.last_clip_at, call.at)
    for job_id, status, _, _, posted in jobs:
        seen = times.get(job_id, 0)
        outcome.delivered_once += seen == 1
        outcome.duplicates += seen > 1
        if seen == 0:
            told = status in (JobStatus.FAILED, JobStatus.EXPIRED, JobStatus.CANCELLED) or posted == 0
            outcome.told += told
            outcome.lost += not told
    return outcome


def first_answer_seconds(handles: Iterable[InteractionHandle]) -> list[float]:
    """Each interaction's first answer time; one never answered counts as infinitely late."""
    return [h.first_callback_seconds if h.first_callback_seconds is not None else float("inf") for h in handles]


def late(handles: Iterable[InteractionHandle]) -> int:
    return sum(h.late for h in handles)
