"""Duties move when the process holding them stops, dies or runs on a wrong clock: the outbox (sending turns) and a
shard's posts, each held by one bot process of the fleet at a time (bot/leases.py), every turn still posted once.

Split from test_fleet.py (its helpers live there) so that the fleet's tests run in parallel, a file a test process.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from db.engine import make_engine, make_sessionmaker
from db.leases import holder_of
from db.models import JobStatus
from relay.settings import DUTY_SECONDS
from tests.bot.helpers import accepted
from tests.bot.test_fleet import (
    clip_messages,
    clip_posts_made,
    fleet,
    fleet_database,
    logs,
    until_all_applied,
)
from tests.bot.test_health import get
from tests.crowd import CLIP, BotProcess, act, burst, crowd, late, read_jobs, settle, setup_servers
from tests.discord_double import DiscordDouble, shard_for
from tests.redis_server import RedisServer
from tests.scrape import free_port
from tests.workers import Worker

pytestmark = pytest.mark.slow  # two or three bot processes, a worker, PostgreSQL and Redis

__all__ = ["fleet_database"]  # the fixture, used here by name


async def outbox_holder(database: str) -> int | None:
    """The pid of the bot process holding the outbox lease now, if any (a holder is ``host:pid:token``)."""
    engine = make_engine(database)
    try:
        async with make_sessionmaker(engine)() as session:
            holder = await holder_of(session, "outbox")
    finally:
        await engine.dispose()
    return int(holder.split(":")[1]) if holder else None


async def until_taken_over(database: str, gone: int, bots: list[BotProcess]) -> tuple[int, float]:
    """Which process holds the outbox once ``gone`` no longer does, and after how many seconds."""
    since = time.monotonic()
    while (holder := await outbox_holder(database)) in (gone, None):
        assert time.monotonic() - since < 60, (holder, logs(bots))
        await asyncio.sleep(0.1)
    return holder, time.monotonic() - since


async def test_when_the_process_sending_turns_stops_or_dies_another_takes_over_and_every_turn_is_posted_once(
    redis_url: str, tmp_path: Path, fleet_database: str, fleet_worker: Worker
) -> None:
    """Three bots of a rolling deploy; the first holds the outbox (it started first), the newest takes the
    interactions and leaves their turns to the outbox. As a burst comes in, the holder is stopped (SIGTERM: it hands
    the lease over as it closes); as a second burst comes in, the next holder is killed (SIGKILL: its lease runs out
    first, DUTY_SECONDS)."""
    guilds, players = crowd(4, guilds=2)
    names = ("first", "second", "new")
    async with fleet(tmp_path, redis_url, fleet_database, guilds, names=names, worker=fleet_worker) as (double, bots):
        await setup_servers(double, guilds, players)
        by_pid = {bot.proc.pid: bot.proc for bot in bots if bot.proc is not None}
        first = await outbox_holder(fleet_database)
        assert first == bots[0].proc.pid
        handles = await burst(double, players[:2])
        by_pid[first].send_signal(signal.SIGTERM)
        second, after_sigterm = await until_taken_over(fleet_database, first, bots)
        second_burst = await burst(double, players[2:])
        # Queued first: a process killed before it answers an interaction loses it (Discord says it failed).
        await asyncio.gather(*(accepted(handle) for handle in second_burst))
        handles += second_burst
        by_pid[second].send_signal(signal.SIGKILL)
        third, after_sigkill = await until_taken_over(fleet_database, second, bots)
        jobs = await settle(double, fleet_database, handles, timeout=120)
    posted = clip_messages(double)
    print(f"fleet of 3: outbox taken over {after_sigterm:.1f} s after SIGTERM, {after_sigkill:.1f} s after SIGKILL")
    assert len({first, second, third}) == 3
    assert after_sigterm <= 5.0, (after_sigterm, logs(bots))  # a few ticks of a loaded machine
    assert after_sigkill <= DUTY_SECONDS + 5.0, (after_sigkill, logs(bots))
    assert late(handles) == 0 and len(jobs) == len(players), logs(bots)
    assert sorted(posted) == sorted(job_id for job_id, *_ in jobs), logs(bots)  # none lost
    assert set(posted.values()) == {1}, (posted, logs(bots))  # none twice


async def test_a_bot_90_s_ahead_and_a_worker_90_s_behind_play_beside_true_time_and_no_turn_runs_twice(
    tmp_path: Path, fleet_database: str
) -> None:
    """Two bots on one PostgreSQL, the newer one's wall clock 90 s ahead and the worker's 90 s behind (libfaketime),
    on a Redis started a moment ago, as in a fleet's first minute. Every deadline is written and compared on the
    database's clock, so the first bot keeps the outbox through a burst, each turn is sent once and none expires;
    killed (SIGKILL), it is taken over once its lease runs out, not 90 s early or late. Before, the bot ahead placed
    the broker's start 90 s late, took every turn sent before that for one the broker had lost, and had it sent and
    made again (29 of the first 95 turns of a soak)."""
    guilds, players = crowd(4, guilds=2)
    fresh = RedisServer(tmp_path / "redis")  # its uptime under 90 s for the whole test
    fresh.start()
    clocks = {"new": "+90s", "worker": "-90s"}
    try:
        async with fleet(tmp_path, fresh.url(0), fleet_database, guilds, clocks=clocks) as (double, bots):
            await setup_servers(double, guilds, players)
            old = bots[0].proc.pid
            held_at_start = await outbox_holder(fleet_database)
            handles = await burst(double, players)
            jobs = await settle(double, fleet_database, handles, timeout=180)
            held_after_burst = await outbox_holder(fleet_database)
            killed = time.monotonic()
            bots[0].proc.kill()
            await until_taken_over(fleet_database, old, bots)  # by the other: the only one left
            takeover = time.monotonic() - killed
    finally:
        fresh.stop()
    print(f"a bot 90 s ahead, the worker 90 s behind: outbox taken over {takeover:.1f} s after SIGKILL")
    assert (held_at_start, held_after_burst) == (old, old), logs(bots)
    assert takeover < DUTY_SECONDS + 5, takeover
    sends = [line for bot in bots for line in bot.log.read_text(errors="replace").splitlines() if " sent to " in line]
    assert len(sends) == len(jobs) == len(players), (sends, logs(bots))
    assert set(clip_messages(double).values()) == {1}, logs(bots)
    assert {status for _, status, *_ in jobs} == {JobStatus.DONE}, logs(bots, jobs)  # none expired, none failed


async def test_a_killed_processs_shard_is_posted_by_another_and_handed_back_under_a_backlog_one_call_a_turn(
    redis_url: str, tmp_path: Path, fleet_database: str, fleet_worker: Worker
) -> None:
    """SHARD_COUNT=2, a process a shard, each posting one turn at a time. Discord holds every post (429s) while the
    turns are made; the process of shard 0 is killed (SIGKILL) with its server's turns unposted. The other stands in
    for shard 0 once its posting lease runs out; Discord now takes 3 s a message, so its posts queue, and shard 0's
    process is started again after its first one: it takes its shard back at once, the stand-in leaves its queued
    posts of shard 0 to it (asked right before each create-message) and it posts them once the stand-in's lease has
    run out. Each turn reaches create-message once (calls counted, not messages: Discord's nonce would fold a second
    call into the first message). Before, a post queued behind its slot went out from both."""
    guilds, players = crowd(6, guilds=2)
    one_at_a_time = {"ANIMEGAMER_DELIVERY_CONCURRENCY": "1"}
    async with fleet(
        tmp_path, redis_url, fleet_database, guilds, shard_ids=("0", "1"), extra_env=one_at_a_time, worker=fleet_worker
    ) as (double, bots):
        await setup_servers(double, guilds, players)
        double.fail("POST", r"/channels/\d+/messages", status=429, retry_after=2, times=None)
        handles = await burst(double, players)
        await until_all_applied(fleet_database, len(players))
        assert bots[0].proc is not None
        bots[0].proc.kill()
        bots[0].proc.wait(10)
        killed = time.monotonic()
        double.clear_faults()
        double.fail("POST", r"/channels/\d+/messages", status=0, delay=3.0, times=None)  # a slow Discord
        shard_0 = {guild.id for guild in guilds if shard_for(guild.id, 2) == 0}
        await double.wait_until(lambda: clips_posted_in(double, shard_0), 120, "a clip posted in shard 0's server")
        takeover = time.monotonic() - killed
        bots[0].start()
        await bots[0].ready(double, ("act",))
        jobs = await settle(double, fleet_database, handles, timeout=120)
    posted, calls = clip_messages(double), clip_posts_made(double, answered=True)
    print(f"a shard's process killed: its turns posted by the other {takeover:.1f} s after SIGKILL")
    assert sorted(posted) == sorted(job_id for job_id, *_ in jobs), logs(bots)  # none lost
    assert set(calls.values()) == {1}, (calls, logs(bots))  # one create-message call each
    assert "posting the turns of shards [0, 1] of 2" in bots[1].log.read_text(errors="replace"), logs(bots)
    assert takeover < DUTY_SECONDS * 4 / 3 + 10, takeover


def clips_posted_in(double: DiscordDouble, guild_ids: set[int]) -> int:
    return sum(
        1
        for message in double.messages()
        if message.guild_id in guild_ids and any(CLIP.fullmatch(a["filename"]) for a in message.attachments)
    )


SLOW = {"motion": "slowly wave", "background": "day town"}  # tests.faulty_worker: 10 s or more


async def test_a_process_whose_discord_calls_hang_gives_its_duties_up_and_every_turn_is_posted_once(
    redis_url: str, tmp_path: Path, fleet_database: str
) -> None:
    """The first process holds the outbox and the shard's posts; it reaches Discord by a name of its own, and every
    REST request it makes is held 40 s, then answered (a proxy holding bytes both ways), while its gateway and its
    database keep working. Alice's slow turn is running, so its supervisor's next progress edit hangs: stuck, it gives
    its duties up within the renew deadline, the other process holds the outbox within the hold and the renew
    deadline, stands in for the shard's posts and posts every turn of a burst sent meanwhile, with one create-message
    call each, and the stuck process's /livez fails. Before, the stuck process kept both and nothing was posted."""
    guilds, (alice, *others) = crowd(4, guilds=1)
    port = free_port()
    quick = {"ANIMEGAMER_PROGRESS_EDIT_SECONDS": "1", "ANIMEGAMER_LIVENESS_SECONDS": "8"}
    async with fleet(
        tmp_path,
        redis_url,
        fleet_database,
        guilds,
        names=("stuck", "live"),
        extra_env=quick,
        discord_host={"stuck": "localhost"},
        faulty_worker={},
        bot_env={"stuck": {"ANIMEGAMER_METRICS_PORT": str(port)}},
    ) as (double, bots):
        stuck = bots[0].proc
        assert stuck is not None
        await setup_servers(double, guilds, [alice, *others])
        assert await outbox_holder(fleet_database) == stuck.pid
        await accepted(await act(double, alice, SLOW))
        await until_running(fleet_database)
        hang = double.fail("*", r".*", status=0, delay=40.0, times=None, host="localhost")
        live_pid, takeover = await until_taken_over(fleet_database, stuck.pid, bots)
        livez = await until_livez_fails(port)
        handles = await burst(double, others)
        jobs = await settle(double, fleet_database, handles, timeout=120)
        hang.clear()
    posted, made = clip_messages(double), clip_posts_made(double)
    print(f"Discord hanging for the outbox's holder: taken over {takeover:.1f} s in; {livez}")
    assert live_pid == bots[1].proc.pid and takeover <= DUTY_SECONDS * (1 + 2 / 3), (takeover, logs(bots))
    assert late(handles) == 0 and len(jobs) == len(others) + 1, logs(bots, jobs)
    assert sorted(posted) == sorted(job_id for job_id, *_ in jobs), logs(bots, jobs)  # none lost
    assert set(made.values()) == {1}, (made, logs(bots, jobs))  # one create-message call each
    assert "given up: this process is stuck" in bots[0].log.read_text(errors="replace"), logs(bots)
    assert "Discord's REST has not answered" in livez


async def until_running(database: str) -> None:
    deadline = time.monotonic() + 60
    while not any(status is JobStatus.RUNNING for _, status, *_ in await read_jobs(database)):
        assert time.monotonic() < deadline, await read_jobs(database)
        await asyncio.sleep(0.1)


async def until_livez_fails(port: int, timeout: float = 30.0) -> str:
    """/livez of the stuck process once it answers 503: its body, which says what is stuck."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = await asyncio.to_thread(get, port, "/livez")
        if status == 503:
            return body
        assert time.monotonic() < deadline, (status, body)
        await asyncio.sleep(0.2)
