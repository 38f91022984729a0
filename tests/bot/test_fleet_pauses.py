"""A bot process that pauses in the middle of its supervisor's tick, between reading the turns and moving them,
wakes and changes nothing another process moved since: every move it decided from that reading is fenced by the
attempt it read (db/jobs.py ``fenced``).

The pause is caused for real: the process reaches Discord by another name (``localhost``), so one slow edit holds
only its tick, right after its reading; it is then stopped there (SIGSTOP), as a frozen VM or a debugger stops it.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from db.engine import make_engine, make_sessionmaker
from db.models import Job, JobStatus
from relay.control import Holder, control_for
from tests.bot.helpers import accepted
from tests.bot.test_faults import signal_all
from tests.bot.test_fleet import clip_messages, database_at, fleet, logs
from tests.crowd import act, crowd, read_jobs, setup_servers
from tests.workers import machine, start_worker, worker_env

pytestmark = pytest.mark.slow  # two bot processes, three workers, PostgreSQL and Redis

CRAWL = {"motion": "crawl", "background": "day town"}  # tests.faulty_worker: over a minute
SLOW = {"motion": "slowly wave", "background": "day town"}  # 10 s or more
WORKER_LEASE = "3"  # a worker's claim lapses 3 s after it stops renewing it; the bots allow 30 s before a hand-back


@pytest.fixture
def database() -> Iterator[str]:
    with database_at("head") as url:
        yield url


async def job_row(database: str, job_id: int) -> tuple:
    engine = make_engine(database)
    try:
        async with make_sessionmaker(engine)() as session:
            row = await session.execute(
                select(Job.status, Job.attempts, Job.task_id, Job.progress_message_id, Job.channel_id).where(
                    Job.id == job_id
                )
            )
            return tuple(row.one())
    finally:
        await engine.dispose()


async def until(what: str, check, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        await asyncio.sleep(0.1)


async def test_a_bot_paused_mid_tick_wakes_and_changes_nothing_another_moved_since(
    redis_url: str, tmp_path: Path, database: str
) -> None:
    """Alice's turn crawls on one worker, Bob's runs on a second that is killed. Once Bob's claim has lapsed, the
    paused bot's next progress edit of Alice's turn is held and the process stopped there, its reading saying Bob's
    worker vanished. The live bot hands Bob's turn back at its deadline and a third worker starts it again; then the
    paused bot is let go. Unfenced, it handed the running turn back a second time, to be computed again."""
    guilds, (alice, bob) = crowd(2, guilds=1)
    async with fleet(
        tmp_path,
        redis_url,
        database,
        guilds,
        names=("live", "paused"),
        extra_env={"ANIMEGAMER_PROGRESS_EDIT_SECONDS": "1", "ANIMEGAMER_CLAIM_SECONDS": "30"},
        discord_host={"paused": "localhost"},
        faulty_worker={"ANIMEGAMER_CLAIM_SECONDS": WORKER_LEASE},
    ) as (double, bots):
        live, paused = bots
        assert paused.proc is not None
        queue = live.env["ANIMEGAMER_QUEUE"]

        def another_worker(name: str):
            env = worker_env(tmp_path / name / "data", redis_url, ANIMEGAMER_QUEUE=queue)
            return start_worker(
                {**env, **machine(tmp_path / name), "ANIMEGAMER_CLAIM_SECONDS": WORKER_LEASE}, "tests.faulty_worker"
            )

        await setup_servers(double, guilds, [alice, bob])
        await accepted(await act(double, alice, CRAWL))
        await until("Alice's turn running", lambda: running(database, 1))
        second = await asyncio.to_thread(another_worker, "second-gpu")  # off the loop the Discord double answers on
        third = None
        try:
            await accepted(await act(double, bob, SLOW))
            await until("Bob's turn running on the second worker", lambda: running(database, 2))
            _, _, task_id, *_ = await job_row(database, 2)
            signal_all(second, signal.SIGKILL)
            third = await asyncio.to_thread(another_worker, "third-gpu")
            control = control_for(redis_url, timeout=5.0)
            await until("Bob's claim lapsed", lambda: absent(control, task_id))
            await asyncio.sleep(1.0)  # every tick from now on reads Bob's turn as vanished
            *_, progress_id, channel_id = await job_row(database, 1)
            held = double.fail(
                "PATCH", rf"/channels/{channel_id}/messages/{progress_id}", status=0, delay=2.0, host="localhost"
            )
            await double.wait_until(lambda: held.hits, 30, "the paused bot's next edit of Alice's progress")
            paused.proc.send_signal(signal.SIGSTOP)
            try:
                await until("Bob's turn started again", lambda: running(database, 2, attempts=2), timeout=120)
            finally:
                paused.proc.send_signal(signal.SIGCONT)
            await until("Bob's turn posted", lambda: posted(database, 2), timeout=120)
            await asyncio.sleep(3.0)  # the woken bot's ticks: anything it moved on its old reading shows now
            bob_row = await job_row(database, 2)
        finally:
            second.kill()
            if third is not None:
                third.kill()
    handed_back = [
        line for bot in bots for line in bot.log.read_text(errors="replace").splitlines() if "job 2 handed back" in line
    ]
    assert bob_row[:2] == (JobStatus.DONE, 2), (bob_row, logs(bots, await read_jobs(database)))
    assert len(handed_back) == 1 and "job 2 handed back" not in paused.log.read_text(errors="replace"), handed_back
    assert clip_messages(double).get(2) == 1


async def running(database: str, job_id: int, attempts: int = 1) -> bool:
    status, tries, *_ = await job_row(database, job_id)
    return status is JobStatus.RUNNING and tries == attempts


async def posted(database: str, job_id: int) -> bool:
    return any(row[0] == job_id and row[4] is not None for row in await read_jobs(database))


async def absent(control, task_id: str) -> bool:
    holders = await asyncio.to_thread(control.holders, [task_id])
    return holders.get(task_id, Holder.ABSENT) is Holder.ABSENT
