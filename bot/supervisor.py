"""The supervisor: one asyncio task that moves every job in flight along ``game.jobs``.

Each tick it reads the jobs from the database (so a restarted bot resumes them all) and:

1. has the outbox (bot/outbox.py) send what may go to the broker now;
2. tells the workers of cancels that could not be marked when they happened;
3. looks at every sent job's claim and stored state in one thread call, asks
   ``game.jobs.next_event`` what that means, and makes the move: started, still alive, handed
   back, succeeded (its result applied once, in one transaction), failed, expired;
4. edits progress messages, and hands finished turns to the delivery.

Every job is handled on its own: an error on one is logged and retried on the next tick, and a
job that keeps failing its own handling is failed with an error id, so no job stops another.
A queue that is down makes the looks fail; then only the moves that need no look are made
(a turn over its time limit, a turn nobody picked up in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from pydantic import ValidationError
from sqlalchemy import select

from bot.background import Background
from bot.cards import progress_text
from bot.clip_deletes import delete_owed
from bot.clip_store import ClipStore
from bot.metrics import BotMetrics
from bot.notices import Notices
from bot.outbox import Outbox
from bot.presence import WorkerPresence
from bot.queue import Look, QueueUnavailable, TurnQueue
from db import clip_deletes, moderation
from db.engine import Sessions
from db.jobs import (
    JobInfo,
    ResultMismatchError,
    apply_result,
    average_turn_seconds,
    beat,
    cancels_to_mark,
    expire_job,
    fail_job,
    hand_back,
    in_attempt,
    jobs_in_flight,
    mark_started,
    note_cancel_marked,
    requeue,
    update_progress,
)
from db.models import Job
from game.contract import PROGRESS_STATE, Progress, Stage, TurnResult, inline
from game.instruction import unreadable
from game.jobs import Event, JobClock, JobStatus, Limits, Seen, deadline_after, next_event
from game.proof import proved
from relay.blob_store import BlobError
from relay.control import ENDED
from relay.settings import Settings

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 30.0
STORE_WAIT = timedelta(minutes=10)  # a made turn whose clip cannot be written (a full disk) waits this long
STORE_BACKOFF_MAX = 60.0  # seconds between its tries, doubling from one
# Redis counts its uptime in whole seconds and the broker's start is put at its earliest (bot/queue.py): a turn sent
# within this of that instant may have gone just before the restart or just after it.
UPTIME_GRAIN = timedelta(seconds=1)
STRIKES = 3  # ticks in a row a job's own handling may fail before the job is failed
UNREADABLE = "This turn can no longer be made: the game changed since it was asked"


class Poster(Protocol):
    """Whoever posts finished turns (bot/delivery.py): the supervisor hands them over at each tick."""

    async def post_pending(self) -> set[int]:
        """Start posting every turn that is ready; the job ids still being posted."""
        ...


def limits_from(settings: Settings) -> Limits:
    return Limits(
        claim=timedelta(seconds=settings.claim_seconds),
        # The worker's hard limit stops the turn; give it a lease to report that before deciding alone.
        run=timedelta(seconds=settings.task_time_limit + max(60.0, settings.claim_seconds)),
        pickup=timedelta(seconds=settings.pickup_timeout) if settings.pickup_timeout else None,
    )


def error_id(job_id: int) -> str:
    """What a player quotes to an admin: short, unique per failure, findable in the log and /admin audit."""
    return f"J{job_id}-{secrets.token_hex(2)}"


class Supervisor(Background):
    name = "animegamer-supervisor"

    def __init__(
        self,
        settings: Settings,
        sessions: Sessions,
        queue: TurnQueue,
        clips: ClipStore,
        metrics: BotMetrics,
        outbox: Outbox,
        presence: WorkerPresence,
        notices: Notices,
        poster: Poster,
    ) -> None:
        self.settings, self.sessions, self.queue, self.clips, self.metrics = settings, sessions, queue, clips, metrics
        self.outbox, self.presence, self.notices, self.poster = outbox, presence, notices, poster
        self.limits, self.clock = outbox.limits, outbox.clock
        # Turns judged lost from the queue for a broker start (below): sent again, they are not judged again for it.
        self._judged: dict[str, datetime] = {}
        self._strikes: dict[int, int] = {}  # job id -> its handling's failures in a row
        self._storing: dict[int, StoreWait] = {}  # job id -> its clip's next try, while the disk refuses it

    async def _run(self) -> None:
        poll = self.settings.delivery_poll_seconds
        delay = poll
        while True:
            self.began()
            try:
                await self.tick()
                self.ticked()
                delay = poll
            except Exception:
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
                log.exception("supervisor tick failed; retrying in %.0fs", delay)
            finally:
                self.ended()
            await asyncio.sleep(delay)

    def start(self) -> None:
        super().start()
        # Renewed on its own schedule, not inside a tick: a tick stuck on Discord or a slow store never lets it lapse.
        self.outbox.lease.start()

    async def stop(self) -> None:
        await super().stop()
        await self.outbox.lease.stop()
        await self.outbox.lease.give_up()  # a clean stop: another process sends from its next tick

    async def tick(self) -> None:
        await self.presence.refresh()
        async with self.sessions() as session:
            to_mark = await cancels_to_mark(session)
            self.outbox.seconds_each = await average_turn_seconds(session, self.outbox.seconds_each)
        await self.outbox.tick(self._guarded)
        for job in to_mark:
            await self._guarded(job, self.mark_cancelled(job))
        seen_at = time.monotonic()
        async with self.sessions() as session:
            await self.clock.sync(session)  # every deadline below is written and compared on the database's clock
            in_flight = await jobs_in_flight(session)
        self.metrics.queue_depth(self.settings, in_flight)
        looks = await self._look([job for job in in_flight if job.sent_at is not None])
        unclaimed = looks is not None and any(look.seen is Seen.NOTHING for look in looks.values())
        broker_started = await self._broker_started() if unclaimed else None
        for job in in_flight:
            await self._guarded(job, self.watch(job, looks, broker_started))
        live = {job.id for job in in_flight}
        self._strikes = {job_id: n for job_id, n in self._strikes.items() if job_id in live}
        self._storing = {job_id: wait for job_id, wait in self._storing.items() if job_id in live}
        posting = await self.poster.post_pending()
        self.notices.keep_only(live | posting, seen_at)

    async def mark_cancelled(self, job: JobInfo) -> None:
        """Tell the workers a sent job was cancelled (the worker checks the mark before and while it runs)."""
        try:
            await self.queue.cancel(job.task_id)
        except QueueUnavailable:
            return  # next tick
        async with self.sessions() as session, session.begin():
            await note_cancel_marked(session, job.id)
        # Whatever its worker stored before it saw the mark (progress, even a whole result) is never
        # read now; one stored after this is dropped with the store's expired rows (Retention).
        await self._forget(job)

    # -- watching ----------------------------------------------------------------------------------

    async def _look(self, jobs: list[JobInfo]) -> dict[str, Look] | None:
        """Every sent job's claim and stored state, or None when the queue does not answer."""
        try:
            looks = await self.queue.look([job.task_id for job in jobs])
        except QueueUnavailable as exc:
            self.presence.queue_answers = False
            log.warning("queue unreachable (%s); deciding only what needs no look", exc)
            return None
        if jobs:
            self.presence.queue_answers = True
        return looks

    async def _lost_from_queue(self, job: JobInfo, broker_started: datetime) -> bool:
        """Whether a turn sent about when the broker started is missing from its queue, judged once per start: the
        turn sent again just after a restart may fall in the same grain, and a worker may have taken it before its
        claim shows."""
        task_id = job.task_id
        same_start = UPTIME_GRAIN * 2  # the start, computed each tick from whole seconds, moves within a second
        judged = self._judged.get(task_id)
        if judged is not None and abs(judged - broker_started) < same_start:
            return False
        try:
            lost = task_id not in await self.queue.still_queued([task_id])
        except QueueUnavailable:
            return False  # asked again next tick
        if lost:
            self._judged = {t: at for t, at in self._judged.items() if abs(at - broker_started) < same_start}
            self._judged[task_id] = broker_started
        return lost

    async def _broker_started(self) -> datetime | None:
        """When the broker last started, on the fleet's clock (its uptime is the broker's own count)."""
        try:
            uptime = await self.queue.broker_uptime()
        except QueueUnavailable:
            return None
        return None if uptime is None else self.clock.now() - uptime

    async def watch(self, job: JobInfo, looks: dict[str, Look] | None, broker_started: datetime | None = None) -> None:
        why = unreadable(job.instruction)
        if why is not None:  # stored by an earlier version: it can never be made, and must not stall the others
            await self.fail(job, f"its stored instruction cannot be read by this version: {why}", UNREADABLE)
            return
        look = looks.get(job.task_id) if looks is not None else None
        seen = look.seen if look is not None else Seen.UNKNOWN if job.sent_at is not None else Seen.NOTHING
        if seen is Seen.NOTHING and job.sent_at and broker_started:
            if job.sent_at < broker_started:
                seen = Seen.LOST  # sent before the broker restarted, and no worker has it
            elif job.sent_at < broker_started + UPTIME_GRAIN and await self._lost_from_queue(job, broker_started):
                # Sent within the grain of Redis's whole-second uptime of its restart: the uptime cannot say on which
                # side, the queue can. (Taken by a worker that has not claimed it yet, it is sent again: a turn
                # sent twice is made once.)
                seen = Seen.LOST
        now = self.clock.now()
        clock = JobClock(job.status, job.sent_at is not None, job.attempts, job.deadline_at, job.started_at)
        event = next_event(clock, seen, now, self.limits)
        if event is Event.BEAT and job.deadline_at is not None and job.deadline_at - now > self.limits.claim * 2 / 3:
            event = None  # seen recently enough: spare the database a write
        if event is not None:
            await self.move(job, event, look)
        progress = Progress.read(look.info) if look is not None and look.state == PROGRESS_STATE else None
        if progress is not None and event is not Event.SUCCEEDED:
            await self.show_progress(job, progress)

    async def move(self, job: JobInfo, event: Event, look: Look | None) -> None:
        now = self.clock.now()
        if event is Event.SUCCEEDED:
            await self.succeed(job, look.info if look is not None else None)
            return
        if event is Event.HANDED_BACK:
            lost_result = look is not None and look.seen is Seen.ENDED
            if lost_result:  # an ended claim refuses every delivery: forget it, if it is still the one seen
                await self.queue.release(job.task_id, ENDED)  # QueueUnavailable: not handed back this tick
            reason = "its result was lost" if lost_result else "its worker stopped reporting"
            async with self.sessions() as session, session.begin():
                deadline = deadline_after(event, now, self.limits)
                moved = await hand_back(session, job.id, deadline, reason, job)
            if moved:
                log.warning("job %s handed back (%s); sending it again", job.id, reason)
                await self.notices.edit_progress(job, f"🎬 {job.instruction}\nA worker stopped; trying again…")
            return
        if event is Event.FAILED:
            await self.fail(job, _worker_error(job, look, self.limits, now))
            return
        async with self.sessions() as session, session.begin():
            if event is Event.STARTED:
                if await mark_started(session, job.id, deadline_after(event, now, self.limits), job, now):
                    log.info("job %s started", job.id)
            elif event is Event.BEAT:
                await beat(session, job.id, deadline_after(event, now, self.limits), job)
            elif event is Event.REQUEUED:
                if await requeue(session, job.id, job):
                    log.warning("job %s: the broker restarted and lost its message; sending it again", job.id)
            elif event is Event.EXPIRED:
                expired = await expire_job(session, job.id, job)
        if event is Event.EXPIRED and expired:
            self.metrics.turn_ended("expired")
            waited = max(1, round((now - job.queued_at).total_seconds() / 60))
            log.warning("job %s expired after %d min in the queue", job.id, waited)
            await self.notices.tell(
                job,
                f"No worker picked up this turn within {waited} min, so it was dropped; nothing was charged. "
                "Try again later.",
            )
            await self._forget(job)

    async def reject(self, job: JobInfo) -> None:
        """A result nobody given the turn wrote (game/proof.py): never posted. It is dropped from the result store, so
        that the worker's own can be stored there (Celery never overwrites a success); where the worker had finished
        already, its claim is seen ended with no result next tick, and the turn is handed back and made again."""
        self.metrics.results_rejected.inc()
        log.warning("job %s: a result without its turn's proof was rejected and dropped (not the worker's)", job.id)
        with contextlib.suppress(QueueUnavailable):
            await self.queue.forget(job.task_id)

    async def succeed(self, job: JobInfo, payload: object) -> None:
        waiting = self._storing.get(job.id)
        if waiting is not None and time.monotonic() < waiting.next_try:
            return
        try:
            stored = TurnResult.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]["msg"]
            await self.fail(job, f"the worker's result was malformed ({exc.error_count()} errors; {first})")
            return
        secret = self.outbox.result_secret
        if secret is not None and not proved(stored, secret, job.task_id):
            await self.reject(job)
            return
        try:
            # Read, not deleted yet: a bot restarted before it records the result reads it again.
            result = await asyncio.to_thread(self.outbox.blobs.resolve_result, stored, job.task_id)
        except BlobError as exc:
            await self.fail(job, f"the worker's result cannot be read: {exc}")
            return
        key = self.clips.key(job.guild_id, job.id)
        mp4 = inline(result.mp4, "the clip")
        try:
            await asyncio.to_thread(self.clips.put, key, mp4)
        except OSError as exc:
            await self._store_later(job, exc)
            return
        self._storing.pop(job.id, None)
        try:
            async with self.sessions() as session, session.begin():
                applied = await apply_result(session, job.id, result, key)
        except ResultMismatchError as exc:
            await self.fail(job, str(exc))
            return
        if not applied:  # cancelled or purged meanwhile, or applied already (another tick or process got there first)
            async with self.sessions() as session:
                status = (await session.execute(select(Job.status).where(Job.id == job.id))).scalar()
            if status is not JobStatus.DONE:  # a done job's recorded clip is this very one: never delete it
                async with self.sessions() as session, session.begin():
                    await clip_deletes.record(session, [key])
                await delete_owed(self.sessions, self.clips, [key])
        else:
            self.metrics.turn_ended("done")
            waited = (self.clock.now() - job.queued_at).total_seconds()
            if job.started_at is None:  # it ran and ended between two ticks: its start is seen only now
                log.info("job %s started (seen as it ended)", job.id)
            log.info("job %s done in %.1fs (%.1fs on the worker)", job.id, waited, sum(result.timings.values()))
        await self._forget(job)
        try:  # recorded: its bytes in Redis need not wait out their day (they expire anyway)
            await asyncio.to_thread(self.outbox.blobs.drop_result, stored, job.task_id)
        except Exception as exc:
            log.info("job %s: its result's blobs were not dropped (%s); they expire on their own", job.id, exc)

    async def _store_later(self, job: JobInfo, exc: OSError) -> None:
        """A made turn whose clip cannot be written (a full disk): its result stays in the store and is tried
        again, backing off, for ``STORE_WAIT``; the player hears once that it is late, and why."""
        now = time.monotonic()
        waiting = self._storing.get(job.id)
        if waiting is None:
            waiting = self._storing[job.id] = StoreWait(since=now, next_try=now)
            log.error("job %s: its clip cannot be stored (%s); trying again for %s", job.id, exc, STORE_WAIT)
            late = "Made, but late: the bot cannot store the clip right now. It will be posted soon."
            await self.notices.edit_progress(job, f"🎬 {job.instruction}\n{late}", force=True)
        if now - waiting.since >= STORE_WAIT.total_seconds():
            del self._storing[job.id]
            await self.fail(job, f"its clip could not be stored for {STORE_WAIT}: {exc}")
            return
        waiting.delay = min(waiting.delay * 2, STORE_BACKOFF_MAX)
        waiting.next_try = now + waiting.delay

    async def fail(self, job: JobInfo, details: str, told: str = "This turn could not be made") -> None:
        """Fail a job: the player gets one sentence and an error id, the server's audit log the error id and what
        went wrong in a few words; the details (host paths, exception text) only the operator's log and the job's
        row, since every admin of the server reads the audit log."""
        eid = error_id(job.id)
        async with self.sessions() as session, session.begin():
            failed = await fail_job(session, job.id, f"[{eid}] {details}"[:2000], job)
            if failed and job.guild_id is not None:
                summary = details.split(": ", 1)[0].split(" (", 1)[0]
                await moderation.audit(session, job.guild_id, 0, "turn failed", f"job {job.id}", f"{eid}: {summary}")
        if not failed:
            return
        self.metrics.turn_ended("failed")
        log.error("job %s failed [%s]: %s", job.id, eid, details)
        await self.notices.tell(job, f"{told} (error `{eid}`); try again with /act.")
        await self._forget(job)

    async def show_progress(self, job: JobInfo, progress: Progress) -> None:
        """Written and shown only while the job is in the attempt this tick read: a process that paused after its
        reading never shows an old attempt's step over a turn handed back and started again since."""
        if progress.stage is Stage.DENOISE and progress.total > 0 and job.status is JobStatus.RUNNING:
            async with self.sessions() as session, session.begin():
                await update_progress(session, job.id, progress.step, progress.total, job)

        async def current() -> bool:
            async with self.sessions() as session:
                return await in_attempt(session, job.id, job.attempts)

        await self.notices.edit_progress(job, progress_text(job.instruction, progress), current=current)

    async def _forget(self, job: JobInfo) -> None:
        with contextlib.suppress(QueueUnavailable):
            await self.queue.forget(job.task_id)

    # -- isolation ---------------------------------------------------------------------------------

    async def _guarded(self, job: JobInfo, step: Awaitable[object]) -> None:
        """Run one job's step; an error stays with that job, and one that keeps failing fails the job."""
        try:
            await step
            self._strikes.pop(job.id, None)
        except QueueUnavailable as exc:  # the queue's fault, not the job's: the next tick tries again
            log.info("job %s: waiting for the queue (%s)", job.id, exc)
        except Exception as exc:
            strikes = self._strikes.get(job.id, 0) + 1
            self._strikes[job.id] = strikes
            log.warning("job %s: handling failed (%d of %d): %r", job.id, strikes, STRIKES, exc, exc_info=strikes == 1)
            if strikes >= STRIKES:
                self._strikes.pop(job.id, None)
                with contextlib.suppress(Exception):
                    await self.fail(job, f"the bot could not handle it: {type(exc).__name__}: {exc}")


def _worker_error(job: JobInfo, look: Look | None, limits: Limits, now: datetime) -> str:
    """The details of a failure, for the log and the audit (never shown to the player as is)."""
    if look is not None and look.seen is Seen.FAILED:
        info = look.info
        return f"the worker failed: {type(info).__name__}: {info}" if isinstance(info, BaseException) else str(info)
    if job.status is JobStatus.RUNNING and job.started_at is not None and now >= job.started_at + limits.run:
        return f"it ran past the time limit ({limits.run.total_seconds():.0f} s) without an answer"
    return f"its worker stopped reporting {job.attempts} time(s)"


@dataclass
class StoreWait:
    """A made turn's clip that the disk refused: when it was first refused, and when to try next."""

    since: float
    next_try: float
    delay: float = 0.5  # doubled before each wait: 1 s, 2 s, 4 s, ... STORE_BACKOFF_MAX
