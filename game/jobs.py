"""A turn's job, as one state machine: its states, the moves between them, who owns each wait.

A job is queued, running, done, failed, cancelled or expired; the last four are final. Every
move is a named ``Event`` with the states it may start from (``MOVES``). ``db.jobs`` applies an
event with one guarded UPDATE (``... WHERE status IN <sources>``), so two processes racing to
move the same job resolve in the database: one UPDATE matches, the other sees no row.

Each state that is not final has an owner who must move it on, and a deadline after which the
bot's supervisor moves it instead (``next_event``):

- queued, not yet sent: owned by the bot's outbox. Deadline: ``pickup`` after it could first be
  sent (a story turn waits for the one before it, which bounds it). Then: expired.
- queued, sent: owned by the broker and its workers. Deadline: submitted + ``pickup``, a few
  times the ETA the player was shown. Then: expired; sent again at once if the broker restarted
  and lost it.
- running: owned by the worker holding the job's claim. Deadlines: the last sign of that worker
  + ``claim`` (then handed back to the outbox, and failed after ``attempts`` sends), and started
  + ``run``, the time limit (then failed).

A story's turns are made one after another: a story turn is sent only once the turn before it
has ended, so its history holds every earlier turn. Until then it has no deadline of its own;
its predecessor's bounds it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


FINAL = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED})
IN_FLIGHT = (JobStatus.QUEUED, JobStatus.RUNNING)


class Event(enum.StrEnum):
    SENT = "sent"  # the outbox handed the task to the broker
    STARTED = "started"  # a worker claimed it
    BEAT = "beat"  # its worker is still there: the deadline moves on
    HANDED_BACK = "handed_back"  # its worker vanished (or its result was lost): the outbox sends it again
    REQUEUED = "requeued"  # the broker restarted and lost its message: the outbox sends it again
    SUCCEEDED = "succeeded"  # its result was applied to the character
    FAILED = "failed"
    CANCELLED = "cancelled"  # the player (or an admin) called it off
    EXPIRED = "expired"  # nobody picked it up in time


@dataclass(frozen=True)
class Move:
    sources: frozenset[JobStatus]
    target: JobStatus


_Q, _R = JobStatus.QUEUED, JobStatus.RUNNING
MOVES: dict[Event, Move] = {
    Event.SENT: Move(frozenset({_Q}), _Q),
    Event.STARTED: Move(frozenset({_Q}), _R),
    Event.BEAT: Move(frozenset({_R}), _R),
    Event.HANDED_BACK: Move(frozenset({_R}), _Q),
    Event.REQUEUED: Move(frozenset({_Q}), _Q),
    Event.SUCCEEDED: Move(frozenset({_Q, _R}), JobStatus.DONE),
    Event.FAILED: Move(frozenset({_Q, _R}), JobStatus.FAILED),
    Event.CANCELLED: Move(frozenset({_Q, _R}), JobStatus.CANCELLED),
    Event.EXPIRED: Move(frozenset({_Q}), JobStatus.EXPIRED),
}


class IllegalMove(ValueError):
    def __init__(self, status: JobStatus, event: Event) -> None:
        super().__init__(status, event)
        self.status, self.event = status, event

    def __str__(self) -> str:
        return f"a {self.status} job cannot be {self.event}"


def move(status: JobStatus, event: Event) -> JobStatus:
    """The state ``event`` takes a job in ``status`` to; IllegalMove if it may not happen there."""
    rule = MOVES[event]
    if status not in rule.sources:
        raise IllegalMove(status, event)
    return rule.target


# --------------------------------------------------------------------------------------------
# Deadlines: what the supervisor does when an owner is late
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """How long each owner has; the bot builds it from settings."""

    claim: timedelta  # a running turn's worker may go unseen this long (a killed worker, a lost Redis)
    run: timedelta  # the turn time limit, plus time for the worker to report it
    pickup: timedelta | None = None  # a sent turn's wait for a worker; None: PICKUP_ETAS times its ETA
    min_pickup: timedelta = timedelta(minutes=2)  # the automatic pickup timeout is never shorter
    attempts: int = 2  # sends before a turn whose worker keeps vanishing is failed

    def __post_init__(self) -> None:
        if min(self.claim, self.run, self.pickup or self.min_pickup) <= timedelta(0) or self.attempts < 1:
            raise ValueError(f"limits must be positive: {self}")

    def pickup_for(self, eta: timedelta) -> timedelta:
        """How long a turn may wait for a worker, given the ETA the player was shown."""
        return self.pickup if self.pickup is not None else max(self.min_pickup, PICKUP_ETAS * eta)


PICKUP_ETAS = 3  # "a few times the ETA": a turn still waiting at three times its ETA is not coming


class Seen(enum.StrEnum):
    """What the worker side shows of a job at one look (the result store and the claims)."""

    NOTHING = "nothing"  # no claim, no state: still in the queue, or lost with its worker
    WORKING = "working"  # a worker holds its claim or reports progress
    SUCCEEDED = "succeeded"  # a result is stored
    FAILED = "failed"  # the worker stored an error
    ENDED = "ended"  # the worker says it ended, yet no result is stored (lost, expired)
    LOST = "lost"  # no claim, no state, and the broker restarted since it was sent: its message is gone
    UNKNOWN = "unknown"  # the store did not answer this time: decide nothing that needs it


@dataclass(frozen=True)
class JobClock:
    """The facts about a job that the deadline rules read."""

    status: JobStatus
    sent: bool
    attempts: int  # times sent so far
    deadline_at: datetime | None  # the current state's deadline; None while a story turn waits its turn
    started_at: datetime | None = None


def next_event(job: JobClock, seen: Seen, now: datetime, limits: Limits) -> Event | None:
    """The move the supervisor makes on a job in flight, given what the worker side shows now.

    A stored result or error wins over every deadline: the work is done, whatever was late.
    """
    if job.status in FINAL:
        return None
    if seen is Seen.SUCCEEDED:
        return Event.SUCCEEDED
    if seen is Seen.FAILED:
        return Event.FAILED
    if job.status is JobStatus.QUEUED:
        if job.sent and seen in (Seen.WORKING, Seen.ENDED):
            return Event.STARTED  # an ENDED with no result is handed back from running, next look
        if job.deadline_at is not None and now >= job.deadline_at:
            return Event.EXPIRED
        if job.sent and seen is Seen.LOST:
            return Event.REQUEUED
        return None
    # Running.
    if job.started_at is not None and now >= job.started_at + limits.run:
        return Event.FAILED  # over the time limit and its worker never said so
    if seen is Seen.WORKING:
        return Event.BEAT
    # Nothing to see (LOST: a restarted broker forgot its claim and any result, made or not) is a worker gone only
    # once its claim has lapsed: one still computing claims it again at its next renewal.
    unseen = seen in (Seen.NOTHING, Seen.LOST) and job.deadline_at is not None and now >= job.deadline_at
    vanished = seen is Seen.ENDED or unseen
    if vanished:
        return Event.HANDED_BACK if job.attempts < limits.attempts else Event.FAILED
    return None


def deadline_after(event: Event, now: datetime, limits: Limits, eta: timedelta = timedelta(0)) -> datetime | None:
    """The deadline of the state ``event`` leads to; None for final states.

    ``eta`` is the job's expected wait (its place in the queue times one turn's time), which the
    automatic pickup timeout scales with.
    """
    target = MOVES[event].target
    if target is JobStatus.RUNNING:
        return now + limits.claim
    if target is JobStatus.QUEUED:
        return now + limits.pickup_for(eta)
    return None
