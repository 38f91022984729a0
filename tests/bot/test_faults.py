"""Faults, caused for real: every turn still ends exactly once, with a message when it cannot be made.

The real bot against the loopback Discord, real worker processes on the SQLite broker and on Redis. Each
test causes its fault from outside: a Discord route that fails, a queue that is down while the bot stops,
a worker killed with SIGKILL, a turn that hangs, a channel that refuses posts, a missing permission, a full disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import select

from db.models import AuditLog, Character, Job, JobStatus, Turn
from relay.settings import Settings
from tests.bot.conftest import read_db, running_bot, settings_beside, wait_for_db
from tests.bot.helpers import accepted, dead_queue, private_text, refusal, running_bot_on, shown
from tests.discord_double import ATTACH_FILES, DEFAULT_PERMISSIONS, WEBHOOK_PATH, Channel, DiscordDouble, Guild, member
from tests.workers import Worker, redis_url_or_skip, start_worker, worker_env

pytestmark = pytest.mark.slow

ALICE, BOB = member("alice"), member("bob")
CLIP_POSTS = r"/channels/\d+/messages"
WAVE = {"motion": "gently wave", "background": "day town"}
SLOW = {"motion": "slowly wave", "background": "day town"}  # tests.faulty_worker makes it last 10 s or more


@pytest.fixture(params=["sqlite", "redis"])
def worker(request: pytest.FixtureRequest) -> Worker:
    """The session's worker on each broker."""
    return request.getfixturevalue(f"{request.param}_worker")


@pytest.fixture
def settings(worker: Worker, tmp_path: Path) -> Settings:
    return settings_beside(worker, tmp_path)


def clip_posts(double: DiscordDouble, channel_id: int | None = None) -> list:
    return [
        c
        for c in double.calls_to("POST", CLIP_POSTS if channel_id is None else rf"/channels/{channel_id}/messages")
        if c.status == 200 and any(f.filename.endswith(".mp4") for f in c.files)
    ]


async def start(double: DiscordDouble, user=ALICE, **context) -> None:
    assert "You play" in private_text(
        await (await double.slash("start", {"character": "Qiqi"}, user=user, **context)).answer()
    )


async def done(settings: Settings, count: int = 1, timeout: float = 120) -> list:
    return await wait_for_db(
        settings,
        select(Job.status, Job.result_message_id).order_by(Job.id),
        lambda rows: len(rows) == count and all(posted is not None for _, posted in rows),
        timeout=timeout,
    )


async def slow_turn_running(double: DiscordDouble, settings: Settings) -> None:
    """Alice's slow turn (``SLOW``), taken and running on a worker: the moment these tests cause their fault."""
    await start(double)
    await accepted(await double.slash("act", SLOW, user=ALICE))
    await wait_for_db(settings, select(Job.status), lambda rows: rows[0][0] == JobStatus.RUNNING, timeout=60)


def standby(env: dict[str, str], module: str = "animegamer") -> asyncio.Future[Worker]:
    """A second worker on the same queue, started once the first holds the turn (one at a time, acknowledged late),
    so it takes only what is handed back; it starts while the test causes its fault and the claim lapses."""
    return asyncio.ensure_future(asyncio.to_thread(start_worker, env, module))


async def stop_standby(second: asyncio.Future[Worker] | None) -> None:
    if second is not None:
        with contextlib.suppress(BaseException):
            (await second).kill()


def faulty_worker(tmp_path: Path, broker: str, **env: str) -> Worker:
    """A worker of the test's own whose pipeline hangs or dawdles on request (``tests.faulty_worker``)."""
    url = redis_url_or_skip() if broker == "redis" else None
    return start_worker(worker_env(tmp_path / "worker", url, **env), module="tests.faulty_worker")


# -- Discord's side ---------------------------------------------------------------------------------------


async def test_a_lost_reply_to_act_leaves_no_turn_behind(worker, settings):
    async with DiscordDouble(strict=True) as double, running_bot(double, settings, worker):
        await start(double)
        lost = double.fail("POST", r"/interactions/\d+/[^/]+/callback", status=500, times=2)
        handle = await double.slash("act", WAVE, user=ALICE)
        await double.wait_until(lambda: lost.hits == 2 and handle.first_callback_seconds, 30, "the failed defer")
        await asyncio.sleep(6)  # discord.py's third attempt comes after the deadline and gets 10062
        double.clear_faults()
        again = await double.slash("act", WAVE, user=ALICE)  # nothing in flight blocks the next turn
        await accepted(again)
        rows = await done(settings)
    assert not handle.responded  # Discord never took the deferral: the player saw "interaction failed"
    assert [status for status, _ in rows] == [JobStatus.DONE] and len(clip_posts(double)) == 1


async def test_a_progress_message_that_cannot_be_shown_does_not_stop_the_turn(worker, settings, double):
    async with running_bot(double, settings, worker):
        await start(double)
        double.fail("PATCH", r"/webhooks/\d+/[^/]+/messages/@original", status=404, code=10015, times=None)
        await double.slash("act", WAVE, user=ALICE)
        rows = await done(settings)
    assert rows[0][0] == JobStatus.DONE and len(clip_posts(double)) == 1


async def test_a_turn_committed_but_not_sent_when_the_bot_stopped_is_sent_after_the_restart(worker, settings, double):
    async with running_bot_on(double, settings, dead_queue(settings)):  # the send fails; then the bot stops
        await start(double)
        await accepted(await double.slash("act", WAVE, user=ALICE))
    ((sent_at,),) = await wait_for_db(settings, select(Job.sent_at), lambda rows: len(rows) == 1)
    assert sent_at is None  # committed, never sent: what a bot killed between the two leaves
    async with running_bot(double, settings, worker):
        rows = await done(settings)
        await asyncio.sleep(1.0)  # a few more ticks: nothing else is posted
    assert rows[0][0] == JobStatus.DONE and len(clip_posts(double)) == 1


# -- posting ---------------------------------------------------------------------------------------------


async def test_a_post_refused_for_good_ends_undeliverable_beside_one_that_is_posted(worker, settings):
    closed, open_ = Channel("closed"), Channel("open")
    async with DiscordDouble([Guild(channels=[closed, open_])]) as double, running_bot(double, settings, worker):
        double.fail("POST", rf"/channels/{closed.id}/messages", status=403, code=50013, times=None)
        await start(double, ALICE, channel_id=closed.id)
        await start(double, BOB, channel_id=open_.id)
        alice = await double.slash("act", WAVE, user=ALICE, channel_id=closed.id)
        await accepted(alice)
        await accepted(await double.slash("act", WAVE, user=BOB, channel_id=open_.id))
        rows = await done(settings, 2)
        told = await alice.followups(timeout=15)
    assert sorted(posted for _, posted in rows)[0] == 0  # Alice's: undeliverable, never retried
    assert len(clip_posts(double, open_.id)) == 1 and clip_posts(double, closed.id) == []
    note = private_text(told[-1])
    assert "could not post it" in note and "not allowed" in note


@pytest.mark.parametrize("dms_open", [True, False], ids=["dm", "audit"])
async def test_a_player_whose_turn_cannot_be_posted_is_reached_by_dm_else_in_the_audit_log(
    sqlite_worker, tmp_path, dms_open
):
    settings = settings_beside(sqlite_worker, tmp_path)
    closed = Channel("closed")
    player = member("dana", dms_open=dms_open)
    async with (
        DiscordDouble([Guild(channels=[closed], members=[player])]) as double,
        running_bot(double, settings, sqlite_worker),
    ):
        double.fail("POST", rf"/channels/{closed.id}/messages", status=403, code=50013, times=None)
        await start(double, player, channel_id=closed.id)
        await accepted(await double.slash("act", WAVE, user=player, channel_id=closed.id))
        # The interaction's token is dead by the time the turn is done, however fast the turn: Discord's
        # answer to a followup after its 15 minutes. No followup can reach the player.
        double.fail("POST", WEBHOOK_PATH, status=404, code=10015, message="Unknown Webhook", times=None)
        await done(settings)
        dms = double.dms(player)
        audit = await wait_for_db(settings, select(AuditLog.action, AuditLog.target), lambda rows: True)
    if dms_open:
        assert len(dms) == 1 and "could not post it" in dms[0].content
    else:
        assert dms == [] and ("player not reached", str(player.id)) in audit


async def test_a_post_failing_for_a_while_is_retried_and_posted_once(worker, settings, double):
    async with running_bot(double, settings, worker):
        await start(double)
        flaky = double.fail("POST", CLIP_POSTS, status=503, times=2)
        await accepted(await double.slash("act", WAVE, user=ALICE))
        await done(settings)
    ((attempts,),) = await wait_for_db(settings, select(Job.post_attempts), lambda rows: True)
    assert flaky.hits == 2 and attempts == 2 and len(clip_posts(double)) == 1


async def test_a_channel_where_the_bot_may_not_attach_files_is_refused_before_any_work(sqlite_worker, tmp_path):
    settings = settings_beside(sqlite_worker, tmp_path)
    no_files = Channel("no-files", bot_permissions=DEFAULT_PERMISSIONS & ~ATTACH_FILES)
    async with DiscordDouble([Guild(channels=[no_files])]) as double, running_bot(double, settings, sqlite_worker):
        await start(double, channel_id=no_files.id)
        handle = await double.slash("act", WAVE, user=ALICE, channel_id=no_files.id)
        refusal(await handle.answer(), "Attach Files")
    assert await wait_for_db(settings, select(Job.id), lambda rows: True) == []


@contextmanager
def full_disk(folder: Path) -> Iterator[Path]:
    """``folder`` as a 64 KiB tmpfs filled to the last byte: every write there fails with ENOSPC, for real."""
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here to fill ({mounted.stderr.decode().strip()}); needs root")
    try:
        filler = folder / "filler"
        with filler.open("wb", buffering=0) as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 4096)
        yield filler
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


async def test_a_made_turn_whose_clip_the_full_disk_refuses_waits_tells_the_player_and_is_posted_once_room_comes(
    sqlite_worker, tmp_path
):
    settings = settings_beside(sqlite_worker, tmp_path)
    with full_disk(tmp_path / "clips") as filler:
        async with DiscordDouble() as double, running_bot(double, settings, sqlite_worker):
            await start(double)
            handle = await double.slash("act", WAVE, user=ALICE)
            await accepted(handle)
            await double.wait_until(lambda: "late" in handle.original.content, 60, "the late notice")
            await asyncio.sleep(3)  # a few tries, backing off: the turn neither fails nor posts meanwhile
            ((status,),) = await read_db(settings, select(Job.status))
            partial = [p.name for p in (tmp_path / "clips").rglob("*") if p.name.endswith(".partial")]
            filler.unlink()  # the disk has room again
            rows = await wait_for_db(settings, select(Job.status, Job.result_message_id), lambda r: r[0][1], timeout=90)
            await asyncio.sleep(1.0)  # a few more ticks: nothing is posted twice
    assert status is not JobStatus.FAILED and partial == []
    assert rows[0][0] == JobStatus.DONE and len(clip_posts(double)) == 1


# -- workers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["sqlite", "redis"])
async def test_a_killed_workers_turn_is_handed_back_and_made_once(broker, double, tmp_path):
    first = faulty_worker(tmp_path, broker, ANIMEGAMER_CLAIM_SECONDS="3")
    settings = settings_beside(first, tmp_path)
    second = None
    try:
        async with running_bot(double, settings, first):
            await slow_turn_running(double, settings)
            second = standby(first.env)  # a plain worker: the turn at full speed once it is handed back
            first.kill(signal.SIGKILL)  # the whole worker, mid-turn
            await second
            rows = await wait_for_db(
                settings, select(Job.status, Job.result_message_id, Job.attempts), lambda r: r[0][1], timeout=240
            )
            await asyncio.sleep(1.0)
    finally:
        first.kill()
        await stop_standby(second)
    ((status, _, attempts),) = rows
    assert status == JobStatus.DONE and attempts == 2 and len(clip_posts(double)) == 1


@pytest.mark.parametrize("to", ["main", "group"], ids=["to-the-main-process", "to-every-process"])
async def test_sigterm_to_a_worker_mid_turn_ends_it_cleanly_and_the_turn_is_posted_once(to, double, tmp_path):
    """``docker stop`` signals the main process; systemd's default KillMode=control-group every process at once."""
    first = faulty_worker(tmp_path, "redis")
    settings = settings_beside(first, tmp_path)
    second = None
    try:
        async with running_bot(double, settings, first):
            await slow_turn_running(double, settings)
            second = standby(first.env)  # takes the turn if it is handed back
            if to == "main":
                first.proc.send_signal(signal.SIGTERM)
            else:
                signal_all(first, signal.SIGTERM)
            status = await asyncio.to_thread(first.proc.wait, 120)
            await second
            posted = select(Job.status, Job.result_message_id)
            rows = await wait_for_db(settings, posted, lambda r: r[0][1], timeout=240)
            await asyncio.sleep(1.0)  # a few more ticks: nothing is posted twice
    finally:
        first.kill()
        await stop_standby(second)
    assert status == 0, first.log.read_text(errors="replace")[-3000:]
    assert rows[0][0] == JobStatus.DONE and len(clip_posts(double)) == 1


def signal_all(worker: Worker, sig: int) -> None:
    """``sig`` to the worker and its pool's children: what a frozen VM or a cut-off machine looks like (SIGSTOP)."""
    children = subprocess.run(["pgrep", "-P", str(worker.proc.pid)], capture_output=True, text=True).stdout.split()
    for pid in [worker.proc.pid, *map(int, children)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def test_a_worker_frozen_past_its_lease_stops_the_turn_another_took_and_it_is_posted_once(double, tmp_path):
    first = faulty_worker(tmp_path, "redis", ANIMEGAMER_CLAIM_SECONDS="3")
    settings = settings_beside(first, tmp_path)
    second = None
    try:
        async with running_bot(double, settings, first):
            await slow_turn_running(double, settings)
            second = standby(first.env, "tests.faulty_worker")
            signal_all(first, signal.SIGSTOP)  # frozen mid-turn: its lease lapses, the bot hands the turn back
            await second
            await wait_for_db(settings, select(Job.attempts, Job.status), lambda r: r[0] == (2, JobStatus.RUNNING))
            signal_all(first, signal.SIGCONT)  # awake while the second computes the same turn
            posted = select(Job.status, Job.result_message_id)
            rows = await wait_for_db(settings, posted, lambda r: r[0][1], timeout=240)
            deadline = time.monotonic() + 30
            while not first.said("lost its claim"):  # its next renewal finds the second worker's claim
                assert time.monotonic() < deadline, first.log.read_text(errors="replace")[-3000:]
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # a few more ticks: nothing is posted twice
    finally:
        signal_all(first, signal.SIGCONT)
        first.kill()
        await stop_standby(second)
    assert rows[0][0] == JobStatus.DONE and len(clip_posts(double)) == 1
    assert first.said(" done in ") == 0  # it stopped computing the turn it no longer held


async def test_a_hung_turn_is_stopped_at_the_time_limit_and_the_player_told_in_one_sentence(double, tmp_path):
    worker = faulty_worker(tmp_path, "sqlite", ANIMEGAMER_TASK_TIME_LIMIT="20")  # soft at 10 s: the next turn's time
    settings = settings_beside(worker, tmp_path)
    try:
        async with running_bot(double, settings, worker):
            await start(double)
            hung = await double.slash("act", {"motion": "hang", "background": "town"}, user=ALICE)
            await accepted(hung)
            await wait_for_db(settings, select(Job.status), lambda rows: rows[0][0] == JobStatus.FAILED, timeout=90)
            await double.wait_until(lambda: "could not be made" in hung.original.content, 15, "the failure notice")
            await accepted(await double.slash("act", WAVE, user=ALICE))  # the pool replaced its child: play goes on
            rows = await wait_for_db(
                settings, select(Job.status).order_by(Job.id), lambda r: r[-1][0] == JobStatus.DONE, timeout=90
            )
            audit = await wait_for_db(settings, select(AuditLog.action, AuditLog.details), lambda r: bool(r))
            ((error,), _) = await read_db(settings, select(Job.error).order_by(Job.id))
    finally:
        worker.kill()
    notice = hung.original.content.splitlines()[-1]
    eid = notice.split("`")[1]
    assert notice.startswith("This turn could not be made (error `J") and "TimeLimit" not in notice
    assert [status for (status,) in rows] == [JobStatus.FAILED, JobStatus.DONE]
    # Every admin of the server reads the audit log: the error id and a few words; the exception, the operator's.
    assert audit[0] == ("turn failed", f"{eid}: the worker failed")
    assert eid in error and "TimeLimitExceeded" in error


async def test_a_result_that_does_not_fit_its_job_fails_that_turn_with_a_message(double, tmp_path):
    worker = faulty_worker(tmp_path, "sqlite")
    settings = settings_beside(worker, tmp_path)
    try:
        async with running_bot(double, settings, worker):
            await start(double)
            odd = await double.slash("act", {"motion": "greet a stranger", "background": "town"}, user=ALICE)
            await accepted(odd)
            await wait_for_db(settings, select(Job.status), lambda rows: rows[0][0] == JobStatus.FAILED, timeout=90)
            await double.wait_until(lambda: "could not be made" in odd.original.content, 15, "the failure notice")
            audit = await wait_for_db(settings, select(AuditLog.details), lambda rows: bool(rows))
            ((error,),) = await read_db(settings, select(Job.error))
            ((stamina,),) = await wait_for_db(settings, select(Character.stamina), lambda rows: True)
    finally:
        worker.kill()
    assert "someone-else" in error and stamina == 50  # logged for the operator, and the character untouched
    assert audit[0][0].startswith("J") and "handed to job" in audit[0][0]  # the error id and a few words for admins
    assert clip_posts(double) == []


async def test_a_clip_the_detector_flags_or_cannot_check_is_withheld_and_the_next_is_posted(double, tmp_path):
    """A real worker whose detector flags the frame a test chooses ("flagged"), or raises ("blinded")."""
    worker = faulty_worker(tmp_path, "sqlite")
    settings = settings_beside(worker, tmp_path)
    try:
        async with running_bot(double, settings, worker):
            await start(double)
            for motion in ("flagged wave", "blinded wave", "gently wave"):
                await accepted(await double.slash("act", {"motion": motion, "background": "day town"}, user=ALICE))
                await done(settings, count=["flagged wave", "blinded wave", "gently wave"].index(motion) + 1)

            def told() -> list[str]:  # privately: a followup to the /act, or a DM where the followup was refused
                followups = [shown(c).get("content") or "" for c in double.calls_to("POST", WEBHOOK_PATH)]
                return [text for text in followups + [m.content for m in double.dms(ALICE)] if "not posted" in text]

            await double.wait_until(lambda: len(told()) >= 2, 10, "the player told of both withheld clips")
        withheld = await read_db(settings, select(Turn.clip_withheld).order_by(Turn.id))
        audit = await read_db(settings, select(AuditLog.action, AuditLog.details).order_by(AuditLog.id))
    finally:
        worker.kill()
    assert len(clip_posts(double)) == 1  # only the third turn's clip was ever uploaded
    assert "female breast exposed, 0.97" in withheld[0][0] and "could not be checked" in withheld[1][0]
    assert withheld[2][0] is None
    assert [action for action, _ in audit] == ["clip withheld", "clip withheld"]
    assert len(told()) == 2 and "still counts" in told()[0]


# -- cancel ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["sqlite", "redis"])
async def test_cancel_means_cancel_queued_or_running(broker, tmp_path):
    worker = faulty_worker(tmp_path, broker)
    settings = settings_beside(worker, tmp_path)
    players = [member(name) for name in ("alice", "bob", "carol")]
    try:
        async with DiscordDouble() as double, running_bot(double, settings, worker):
            for player in players:
                await start(double, player)
            for player in players[:2]:
                await accepted(await double.slash("act", SLOW, user=player))
            jobs = await wait_for_db(  # and both sent: one cancelled before its send never reaches the worker at all
                settings,
                select(Job.status, Job.user_id, Job.sent_at),
                lambda rows: JobStatus.RUNNING in {s for s, _, _ in rows} and all(sent for *_, sent in rows),
                timeout=60,
            )
            by_status = {status: user_id for status, user_id, _ in jobs}
            for status in (JobStatus.QUEUED, JobStatus.RUNNING):  # the one waiting behind, then the one running
                player = next(p for p in players if p.id == by_status[status])
                assert "Cancelled" in shown(await (await double.slash("cancel", user=player)).answer())["content"]
            await accepted(
                await double.slash("act", {"motion": "quickly run", "background": "day town"}, user=players[2])
            )
            rows = await wait_for_db(
                settings,
                select(Job.status, Job.result_message_id).order_by(Job.id),
                lambda rows: len(rows) == 3 and rows[2][1] is not None,
                timeout=240,
            )
            await asyncio.sleep(1.0)
    finally:
        worker.kill()
    assert [status for status, _ in rows] == [JobStatus.CANCELLED, JobStatus.CANCELLED, JobStatus.DONE]
    assert [posted for _, posted in rows[:2]] == [None, None]
    # The queued one is dropped before any work: by its claim's cancel mark, or on Redis, where Celery's
    # revoke is heard too, by the worker's revoked list before it even reaches the task.
    assert worker.said("not run: cancelled") + worker.said("Discarding revoked task") == 1
    assert worker.said("cancelled while it ran; stopped") == 1  # the running one: stopped at a denoising step
    assert worker.said(" done in ") == 1  # only Carol's turn was made
    assert len(clip_posts(double)) == 1
