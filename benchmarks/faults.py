"""How every turn ends under each fault, caused for real: the README's fault table, from one run.

    python benchmarks/faults.py [--players 5] [--only NAME]

For each fault, --players players act at the same instant through the loopback Discord double against
the real bot, real `animegamer worker` processes (tiny model, CPU) and, where the fault is Redis's, a
redis-server of the run's own (no persistence, as this machine's runs). The fault is caused from outside
(a route that fails, a process killed, a server restarted, a channel that refuses), then the run waits
until every job is final and counts, from the game database and the double's records:

- submitted: /act invocations; taken: turns the bot committed (a reply Discord lost takes none);
- delivered once: turns whose clip was posted exactly once; duplicates: posted more than once (must be 0);
- told: turns that failed, expired or could not be posted, whose player got the one-sentence notice;
- refused: /act answered with a refusal before any work; cancelled: turns the player cancelled;
- stuck: turns still in flight at the end (must be 0); computed after cancel (must be 0).

It needs redis-server on PATH for the Redis rows (skipped otherwise). It is a measurement, not a test:
the tests in tests/bot/test_faults.py assert the same behaviours one fault at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.app import AnimeGamerBot
from db.models import Job, JobStatus
from relay.settings import Settings
from tests.bot.conftest import read_db, settings_beside, wait_for_db
from tests.bot.helpers import EPHEMERAL, dead_queue, running_bot_on, shown
from tests.discord_double import ATTACH_FILES, DEFAULT_PERMISSIONS, Channel, DiscordDouble, Guild, member
from tests.redis_server import RedisServer
from tests.workers import Worker, start_worker, worker_env

WAVE = {"motion": "gently wave", "background": "day town"}
SLOW = {"motion": "slowly wave", "background": "day town"}  # tests.faulty_worker: 0.2 s per denoising step
HANG = {"motion": "hang", "background": "town"}  # tests.faulty_worker: never ends
FINAL = {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED}
NOTICES = ("could not be made", "No worker picked up", "could not post it")


@dataclass
class Row:
    fault: str
    submitted: int = 0
    taken: int = 0
    delivered_once: int = 0
    duplicates: int = 0
    told: int = 0
    refused: int = 0
    cancelled: int = 0
    stuck: int = 0
    computed_after_cancel: int = 0
    stall: float = 0.0  # seconds: the bot's event loop's longest stall during the run
    notes: list[str] = field(default_factory=list)


class Run:
    """One fault's world: a folder, the double, workers to clean up, and the bot's settings."""

    def __init__(self, folder: Path, players: int) -> None:
        self.folder, self.players = folder, [member(f"player{i}") for i in range(players)]
        self.workers: list[Worker] = []
        self.servers: list[RedisServer] = []

    def worker(self, url: str | None = None, module: str = "animegamer", **env: str) -> Worker:
        """A worker process; every worker of a run serves the same queue (the first one's)."""
        same = {"ANIMEGAMER_QUEUE": self.workers[0].env["ANIMEGAMER_QUEUE"]} if self.workers else {}
        worker = start_worker(worker_env(self.folder / "worker", url, **env, **same), module=module)
        self.workers.append(worker)
        return worker

    def settings(self, worker: Worker, **changes: object) -> Settings:
        return settings_beside(worker, self.folder, **changes)

    def redis(self) -> RedisServer:
        server = RedisServer(self.folder / "redis")
        server.start()
        self.servers.append(server)
        return server

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        for server in self.servers:
            server.stop()


async def act_all(double: DiscordDouble, players: list, options: dict, **context: object) -> list:
    """Every player acts at the same instant; returns their interactions once each was answered."""
    for player in players:
        await (await double.slash("start", {"character": "Qiqi"}, user=player, **context)).answer()
    handles = await asyncio.gather(*(double.slash("act", options, user=player, **context) for player in players))
    for handle in handles:
        await handle.answer(timeout=30)
    return handles


async def settle(settings: Settings, timeout: float = 240) -> None:
    """Until every job is final and every done one posted (or marked undeliverable), or the timeout."""
    with contextlib.suppress(AssertionError):
        await wait_for_db(
            settings,
            select(Job.status, Job.result_message_id),
            lambda rows: all(s in FINAL and (s != JobStatus.DONE or posted is not None) for s, posted in rows),
            timeout=timeout,
        )
    await asyncio.sleep(1.0)  # a few more ticks: anything posted twice would show now


async def count(
    row: Row, double: DiscordDouble, settings: Settings, handles: list, workers: list[Worker], bot: AnimeGamerBot
) -> Row:
    jobs = await read_db(
        settings, select(Job.id, Job.status, Job.progress_message_id, Job.result_message_id, Job.user_id)
    )
    posts = [
        f.filename
        for call in double.calls
        if call.method == "POST" and call.path.startswith("/channels/") and call.status == 200
        for f in call.files
        if f.filename.endswith(".mp4")
    ]
    row.submitted, row.taken = len(handles), len(jobs)
    row.stall = bot.loop_watch.longest
    for handle in handles:
        if handle.responded:
            answer = shown(await handle.answer(timeout=5))
            row.refused += bool(answer.get("flags", 0) & EPHEMERAL)  # a turn is answered publicly
    logs = "\n".join(w.log.read_text(errors="replace") for w in workers)
    by_message = {handle.original_id: handle for handle in handles}
    for job_id, status, progress_id, posted, user_id in jobs:
        times = posts.count(f"turn_{job_id}.mp4")
        row.delivered_once += times == 1
        row.duplicates += times > 1
        row.stuck += status not in FINAL
        row.cancelled += status is JobStatus.CANCELLED
        row.computed_after_cancel += status is JobStatus.CANCELLED and f"turn {job_id} done in" in logs
        if status in (JobStatus.FAILED, JobStatus.EXPIRED) or posted == 0:
            progress = double.message(progress_id) if progress_id else None
            texts = [progress.content] if progress is not None else []
            handle = by_message.get(progress_id)
            if handle is not None:
                texts += [shown(call).get("content", "") for call in await handle.followups(0)]
            texts += [message.content for message in double.dms(user_id)]
            row.told += any(notice in text for text in texts for notice in NOTICES)
    return row


# -- the faults -------------------------------------------------------------------------------------------


async def no_fault(run: Run) -> Row:
    worker = run.worker()
    settings = run.settings(worker)
    async with DiscordDouble() as double, running_bot_on(double, settings, worker.app) as bot:
        handles = await act_all(double, run.players, WAVE)
        await settle(settings)
        return await count(Row("none"), double, settings, handles, [worker], bot)


async def lost_reply(run: Run) -> Row:
    worker = run.worker()
    settings = run.settings(worker)
    half = len(run.players) // 2
    async with DiscordDouble(strict=True) as double, running_bot_on(double, settings, worker.app) as bot:
        for player in run.players:
            await (await double.slash("start", {"character": "Qiqi"}, user=player)).answer()
        lost = []
        for player in run.players[:half]:  # each of these replies fails twice; the third try is too late
            fault = double.fail("POST", r"/interactions/\d+/[^/]+/callback", status=500, times=2)
            lost.append(await double.slash("act", WAVE, user=player))
            await double.wait_until(lambda fault=fault: fault.hits == 2, 30, "two failed replies")
        handles = lost + await act_all(double, run.players[half:], WAVE)
        await asyncio.sleep(8)  # discord.py's third try comes after the deadline: Discord answers 10062
        await settle(settings)
        row = await count(
            Row("reply to /act lost (two 500s on the callback, then 10062)"), double, settings, handles, [worker], bot
        )
    row.notes.append(f"{sum(not h.responded for h in handles)} players saw Discord's 'interaction failed'")
    return row


async def bot_stopped_before_send(run: Run) -> Row:
    worker = run.worker()
    settings = run.settings(worker)
    async with DiscordDouble() as double:
        async with running_bot_on(double, settings, dead_queue(settings)):
            handles = await act_all(double, run.players, WAVE)
            await asyncio.sleep(1)
        async with running_bot_on(double, settings, worker.app) as bot:
            await settle(settings)
            return await count(Row("bot stopped between commit and send"), double, settings, handles, [worker], bot)


async def redis_lost_queued(run: Run) -> Row:
    server = run.redis()
    first = run.worker(server.url())
    settings = run.settings(first)
    first.kill(signal.SIGTERM)
    async with DiscordDouble() as double, running_bot_on(double, settings, first.app) as bot:
        handles = await act_all(double, run.players, WAVE)
        await wait_for_db(settings, select(Job.sent_at), lambda rows: all(r[0] for r in rows))
        await asyncio.to_thread(server.restart)
        second = await asyncio.to_thread(run.worker, server.url())
        await settle(settings)
        return await count(
            Row("queued turns lost (Redis restarted, no persistence)"), double, settings, handles, [first, second], bot
        )


async def redis_restart_running(run: Run) -> Row:
    server = run.redis()
    worker = run.worker(server.url(), module="tests.faulty_worker", ANIMEGAMER_CLAIM_SECONDS="5")
    settings = run.settings(worker)
    async with DiscordDouble() as double, running_bot_on(double, settings, worker.app) as bot:
        handles = await act_all(double, run.players, SLOW)
        await wait_for_db(settings, select(Job.status), lambda rows: any(s == JobStatus.RUNNING for (s,) in rows))
        await asyncio.to_thread(server.restart)
        await settle(settings)
        return await count(Row("Redis restarted while a turn ran"), double, settings, handles, [worker], bot)


async def worker_killed(run: Run) -> Row:
    first = run.worker(module="tests.faulty_worker", ANIMEGAMER_CLAIM_SECONDS="3")
    settings = run.settings(first)
    async with DiscordDouble() as double, running_bot_on(double, settings, first.app) as bot:
        handles = await act_all(double, run.players, SLOW)
        await wait_for_db(settings, select(Job.status), lambda rows: any(s == JobStatus.RUNNING for (s,) in rows))
        first.kill(signal.SIGKILL)
        second = await asyncio.to_thread(run.worker, None, "animegamer")
        await settle(settings)
        return await count(Row("worker killed mid-turn (SIGKILL)"), double, settings, handles, [first, second], bot)


async def hung_turn(run: Run) -> Row:
    worker = run.worker(module="tests.faulty_worker", ANIMEGAMER_TASK_TIME_LIMIT="10")
    settings = run.settings(worker)
    half = len(run.players) // 2
    async with DiscordDouble() as double, running_bot_on(double, settings, worker.app) as bot:
        hung = await act_all(double, run.players[:half], HANG)
        fine = await act_all(double, run.players[half:], WAVE)
        await settle(settings, timeout=60 + 15 * half)
        return await count(Row("hung turns (time limit 10 s)"), double, settings, hung + fine, [worker], bot)


async def refused_posts(run: Run) -> Row:
    worker = run.worker()
    settings = run.settings(worker)
    closed, open_ = Channel("closed"), Channel("open")
    half = len(run.players) // 2
    async with (
        DiscordDouble([Guild(channels=[closed, open_])]) as double,
        running_bot_on(double, settings, worker.app) as bot,
    ):
        double.fail("POST", rf"/channels/{closed.id}/messages", status=403, code=50013, times=None)
        handles = await act_all(double, run.players[:half], WAVE, channel_id=closed.id)
        handles += await act_all(double, run.players[half:], WAVE, channel_id=open_.id)
        await settle(settings)
        return await count(Row("posts refused for good in one channel (403)"), double, settings, handles, [worker], bot)


async def missing_permission(run: Run) -> Row:
    worker = run.worker()
    settings = run.settings(worker)
    no_files = Channel("no-files", bot_permissions=DEFAULT_PERMISSIONS & ~ATTACH_FILES)
    async with (
        DiscordDouble([Guild(channels=[no_files])]) as double,
        running_bot_on(double, settings, worker.app) as bot,
    ):
        handles = await act_all(double, run.players, WAVE, channel_id=no_files.id)
        await settle(settings)
        return await count(Row("bot may not attach files in the channel"), double, settings, handles, [worker], bot)


async def cancelled(run: Run) -> Row:
    worker = run.worker(module="tests.faulty_worker")
    settings = run.settings(worker)
    async with DiscordDouble() as double, running_bot_on(double, settings, worker.app) as bot:
        handles = await act_all(double, run.players, SLOW)
        await wait_for_db(settings, select(Job.status), lambda rows: any(s == JobStatus.RUNNING for (s,) in rows))
        for player in run.players[:-1]:  # every turn but the last player's: the running one and queued ones
            await (await double.slash("cancel", user=player)).answer()
        await settle(settings)
        return await count(Row("cancelled while queued or running"), double, settings, handles, [worker], bot)


FAULTS: dict[str, Callable[[Run], Awaitable[Row]]] = {
    "none": no_fault,
    "lost-reply": lost_reply,
    "bot-stopped": bot_stopped_before_send,
    "redis-lost-queued": redis_lost_queued,
    "redis-restart-running": redis_restart_running,
    "worker-killed": worker_killed,
    "hung": hung_turn,
    "refused-posts": refused_posts,
    "missing-permission": missing_permission,
    "cancel": cancelled,
}
NEEDS_REDIS = {"redis-lost-queued", "redis-restart-running"}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--players", type=int, default=5)
    parser.add_argument("--only", choices=sorted(FAULTS), action="append")
    args = parser.parse_args()
    rows = []
    for name in args.only or FAULTS:
        if name in NEEDS_REDIS and shutil.which("redis-server") is None:
            print(f"{name}: skipped, redis-server is not installed", file=sys.stderr)
            continue
        run = Run(Path(tempfile.mkdtemp(prefix=f"faults-{name}-")), args.players)
        try:
            rows.append(await FAULTS[name](run))
        finally:
            run.close()
        print(f"{name}: done", file=sys.stderr)
    columns = ["fault", "submitted", "taken", "delivered once", "told (failed, expired, unpostable)", "refused"]
    columns += ["cancelled", "stuck", "duplicates", "computed after cancel", "longest loop stall"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print(
            f"| {r.fault} | {r.submitted} | {r.taken} | {r.delivered_once} | {r.told} | {r.refused} | {r.cancelled} "
            f"| {r.stuck} | {r.duplicates} | {r.computed_after_cancel} | {r.stall:.2f} s |"
        )
    for r in rows:
        for note in r.notes:
            print(f"- {r.fault}: {note}")


if __name__ == "__main__":
    asyncio.run(main())
