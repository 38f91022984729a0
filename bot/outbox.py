"""The outbox: committed turns go to the broker from here, a short window per queue, in the fair order.

Each queue holds only a short window of turns at the broker (a couple per live worker); the rest wait in the
database and go in ``game.schedule``'s fair order, server by server. A submission sends its own turn at once
(``send_now``) when its queue has room and nobody waits before it; the tick sends the rest: a turn whose send
failed or never happened (the bot died in between), a story turn whose predecessor just ended, a job handed back.
Each goes with the job's own task id, so a second send of the same job is dropped by the worker's claim.

One bot process of a fleet sends, the holder of the ``outbox`` lease, so each window is one count: a process
that does not hold it leaves its submissions' turns to the holder, which takes them after ``OUTBOX_GRACE``. The
holder asks its lease before each send, for the longest a send may take (the broker's timeout), and stops sending
the moment it cannot be sure: a process paused past its lease finds out before it sends, not after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select

from bot.leases import LeaseHold
from bot.presence import WorkerPresence
from bot.queue import QueueUnavailable, TurnQueue
from db.engine import Sessions
from db.jobs import JobInfo, arm_deadline, build_history, jobs_in_flight, jobs_to_send, mark_sent
from db.leases import FleetClock
from db.models import Character, GuildSettings, Job, Story, Turn
from game.contract import TurnRequest
from game.history import DEFAULT_WINDOW
from game.instruction import parse, unreadable
from game.jobs import JobStatus, Limits
from game.proof import ticket_for
from game.schedule import Waiting, fair_order, fifo_order, window_for
from relay.blob_store import BlobStore
from relay.celery_app import RELEASE_MODEL, queue_for, queue_of_stored
from relay.settings import Settings

log = logging.getLogger(__name__)

# A turn's time before any was timed, by model: the pickup deadline's first estimate (and the players' first ETAs).
ETA_GUESS_SECONDS = {"tiny": 5.0, "toy": 5.0, "full": 120.0, RELEASE_MODEL: 120.0}
OUTBOX_GRACE = timedelta(seconds=2)  # a fresh job is its submission's to send; the outbox waits this long


class Outbox:
    def __init__(
        self,
        settings: Settings,
        sessions: Sessions,
        queue: TurnQueue,
        blobs: BlobStore,
        presence: WorkerPresence,
        limits: Limits,
        lease: LeaseHold,
    ) -> None:
        self.settings, self.sessions, self.queue, self.blobs = settings, sessions, queue, blobs
        self.presence, self.limits, self.lease = presence, limits, lease
        # The game's secret its turns' tickets are made with (game/proof.py), read from the database at start; None:
        # no proof asked of the workers (an outbox made without a bot, in a test).
        self.result_secret: bytes | None = None
        self.clock = FleetClock()  # every deadline's clock, the database's: the supervisor syncs it each tick
        # A turn's average time, which the supervisor keeps up to date: the pickup deadline's estimate.
        self.seconds_each = ETA_GUESS_SECONDS.get(settings.model, 60.0)
        self._at_broker: Counter[str] = Counter()  # queue -> turns sent and not yet started
        self._backlog: Counter[str] = Counter()  # queue -> turns waiting here for room at the broker
        self._left: set[int] = set()  # jobs their submission left to the backlog: the outbox's at once, no grace
        self._sending = asyncio.Lock()  # the tick and the submissions' own sends, one at a time

    def queue_of(self, job: JobInfo) -> str:
        """The queue a job goes to; the default one for a job this version cannot read (the supervisor fails it)."""
        return queue_of_stored(self.settings, job.instruction)

    def room(self, queue: str) -> int:
        """How many more turns this queue may take at the broker now."""
        return window_for(self.presence.workers_on[queue]) - self._at_broker[queue]

    def sure(self) -> bool:
        """Whether this process holds the outbox for as long as one more send may take."""
        return self.lease.sure(margin=self.settings.broker_timeout)

    async def tick(self, guarded: Callable) -> None:
        """Send what may go now, if this process holds the outbox; ``guarded`` runs each job's send in isolation."""
        if not self.sure():
            with contextlib.suppress(Exception):  # the lease's own loop says why, and tries again
                await self.lease.renew()  # a lease given up by a stopping holder is taken at once
        if self.sure():
            await self.send_in_turn(guarded)

    async def send_in_turn(self, guarded: Callable) -> None:
        """Fill each queue's window at the broker from the backlog, in the fair order (or first come, first served).

        The backlog and the jobs in flight are read under the sending lock, together: a turn read
        before a place freed (a cancel) or before a submission left its turn to the backlog would
        otherwise be passed over for one that was read. A fresh turn is its submission's to send
        (``send_now``) for ``OUTBOX_GRACE``, unless that submission already left it to the backlog.
        """
        async with self._sending:
            async with self.sessions() as session:
                in_flight = await jobs_in_flight(session)
                fresh = self.clock.now() - OUTBOX_GRACE  # queued_at is the database's time
                waiting = [
                    job
                    for job in await jobs_to_send(session)
                    if (job.id in self._left or job.queued_at < fresh) and unreadable(job.instruction) is None
                ]
            unsent = {job.id for job in in_flight if job.status is JobStatus.QUEUED and job.sent_at is None}
            self._left &= unsent
            self._at_broker = Counter(
                self.queue_of(job) for job in in_flight if job.status is JobStatus.QUEUED and job.sent_at is not None
            )
            by_queue: dict[str, list[JobInfo]] = {}
            for job in waiting:
                if job.id in unsent:
                    by_queue.setdefault(self.queue_of(job), []).append(job)
            self._backlog = Counter({queue: len(jobs) for queue, jobs in by_queue.items()})
            for queue, jobs in by_queue.items():
                # A running turn and a sent one both hold the workers: that is the server's share in service.
                in_service = Counter(
                    job.guild_id for job in in_flight if job.sent_at is not None and self.queue_of(job) == queue
                )
                candidates = [Waiting(job.id, job.guild_id, job) for job in jobs]
                ordered = fair_order(candidates, in_service) if self.settings.fair_queue else fifo_order(candidates)
                for turn in ordered[: max(0, self.room(queue))]:
                    if not self.sure():
                        return
                    await guarded(turn.item, self.send(turn.item))

    async def send(self, job: JobInfo) -> bool:
        """Hand a committed job's task to the broker; False (and tried again next tick) if it is down, or if this
        process is no longer sure it holds the outbox (the holder, whichever it is, sends it)."""
        request, queue = await self._request(job)
        if not self.sure():
            return False
        eta = timedelta(seconds=self.seconds_each)
        try:
            await self.queue.send(request, job.task_id, queue)
        except QueueUnavailable as exc:
            log.info("job %s not sent yet: %s", job.id, exc)
            if job.deadline_at is None:  # a story turn whose turn has come: from now on it has a deadline
                async with self.sessions() as session, session.begin():
                    await arm_deadline(session, job.id, self.clock.now() + self.limits.pickup_for(eta))
            return False
        self._at_broker[queue] += 1
        self._backlog[queue] = max(0, self._backlog[queue] - 1)
        async with self.sessions() as session, session.begin():
            now = self.clock.now()
            recorded = await mark_sent(session, job.id, deadline=now + self.limits.pickup_for(eta), now=now)
            status = None if recorded else (await session.execute(select(Job.status).where(Job.id == job.id))).scalar()
        if not recorded and status in (None, JobStatus.CANCELLED):
            # Cancelled (or purged) while its task went out: /cancel saw it unsent and told no worker.
            log.info("job %s was cancelled while it was being sent; telling its workers", job.id)
            with contextlib.suppress(QueueUnavailable):
                await self.queue.cancel(job.task_id)
            return True
        log.info("job %s sent to %s", job.id, queue)
        return True

    async def send_now(self, job_id: int) -> bool:
        """The submission's own send: the outbox's path, right away, for one job if it may go now.

        A turn that finds its queue's window full, or other turns waiting for it, stays in the
        backlog for the next tick's fair pick. False only if it could not be sent (the queue is
        down: the outbox keeps trying until its deadline).
        """
        if not self.sure():  # another process sends: it takes this turn after OUTBOX_GRACE
            return True
        async with self._sending:  # one sender at a time: the window's count stays true
            async with self.sessions() as session:  # read under the lock: the tick may have sent it meanwhile
                ready = await jobs_to_send(session, only=job_id)
            for job in ready:
                queue = self.queue_of(job)
                if self.room(queue) <= 0 or self._backlog[queue] > 0:
                    self._backlog[queue] += 1
                    self._left.add(job.id)
                    return True
                try:
                    return await self.send(job)
                except Exception:
                    log.exception("job %s: not sent at submission; the outbox will send it", job_id)
                    return False
        return True

    async def _request(self, job: JobInfo) -> tuple[TurnRequest, str]:
        """The task's arguments, built now: a story turn's history holds every turn before it."""
        async with self.sessions() as session:
            turn = (await session.execute(select(Turn).where(Turn.id == job.turn_id))).scalar_one()
            source: Story | Character | None = (
                await session.get(Story, turn.story_id)
                if turn.story_id is not None
                else await session.get(Character, turn.character_id)
            )
            window = (
                await session.execute(
                    select(GuildSettings.history_window).where(GuildSettings.guild_id == job.guild_id)
                )
            ).scalar_one_or_none() or DEFAULT_WINDOW
            history = await build_history(session, source, window, turn.model_key) if source is not None else []
        ticket = ticket_for(self.result_secret, job.task_id) if self.result_secret is not None else ""
        request = TurnRequest(
            job_id=str(job.id), instruction=turn.instruction, seed=turn.seed, history=history, ticket=ticket
        )
        request = await asyncio.to_thread(self.blobs.pack_request, request)  # large representations by reference
        return request, queue_for(self.settings, parse(turn.instruction).character)
