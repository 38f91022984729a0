"""This process's hold on a duty that one bot process of the fleet does at a time (db/leases.py).

``start()`` renews it on its own schedule, beside the duty: every third of the lease it takes the lease when it is free
or renews it when it is this process's, one write on the database's clock. The duty asks ``sure()`` before each
move it makes as the holder, which answers from this process's monotonic clock, counted from before the write
that last renewed it: a tick that runs long, or a process paused past its lease (a GC pause, a frozen VM,
SIGSTOP), finds it is not sure and stops, whatever its wall clock says. ``give_up()`` on a clean stop lets another
process take the duty at its next try; a killed process's lease runs out after ``seconds``, so another takes it
over within ``seconds`` and a third of it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from bot.background import Background
from db.engine import Sessions
from db.leases import STANDING_IN, database_now, give_up, give_up_all, lock_in_order, take, take_many

log = logging.getLogger(__name__)


def process_name() -> str:
    """Who holds a lease: the host and pid an operator can find, and a token no restarted process repeats."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _elapsed() -> float:
    """Seconds on a clock that no wall-clock change moves and that goes on while the machine sleeps (Linux's
    CLOCK_BOOTTIME; elsewhere the monotonic clock)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


Working = Callable[[float], "str | None"]  # None while this process works (bot/liveness.py); else why it does not


def renew_deadline(length: timedelta) -> float:
    """Seconds a duty's loop may go without finishing a round before its hold is given up: two thirds of the hold,
    as client-go's leader election renews a 15 s lease within 10 s or gives it up."""
    return length.total_seconds() * 2 / 3


async def _renewing(renew: Callable[[], Awaitable[object]], length: timedelta, what: str) -> None:
    """Take or renew every third of the lease's length, until cancelled; a renewal the database refuses is logged,
    and the holder's own clock says when it may no longer act."""
    while True:
        try:
            await renew()
        except Exception as exc:
            log.warning("%s not renewed (%s)", what, exc)
        await asyncio.sleep(length.total_seconds() / 3)


class Stuck:
    """Asks ``working`` before each renewal: a process stuck for the renew deadline gives its hold up (once, logged)
    instead of renewing it, and takes none until it works again."""

    def __init__(self, working: Working, length: timedelta, what: str) -> None:
        self.working, self.deadline, self.what = working, renew_deadline(length), what
        self._said = False

    def seen(self) -> bool:
        """Whether this process is stuck now, said by no log line (asked before each post)."""
        return self.working(self.deadline) is not None

    def now(self) -> bool:
        why = self.working(self.deadline)
        if why is not None and not self._said:
            log.warning("%s given up: this process is stuck (%s)", self.what, why)
        self._said = why is not None
        return why is not None


def _always_working(_deadline: float) -> str | None:
    return None


class LeaseHold(Background):
    """``start()`` renews it on its own schedule until ``stop()`` (its task is named after the lease)."""

    def __init__(
        self, sessions: Sessions, name: str, holder: str, seconds: float, working: Working = _always_working
    ) -> None:
        self.sessions = sessions
        self.name = name
        self.holder = holder
        self.length = timedelta(seconds=seconds)
        self.stuck = Stuck(working, self.length, f"{name} lease")
        self._sure_until: float | None = None  # on _elapsed(): until when this process surely holds the lease

    async def renew(self) -> bool:
        """Take the lease, or renew it: True if this process holds it now. A stuck process gives it up instead."""
        if self.stuck.now():
            await self.give_up()
            return False
        asked = _elapsed()  # counted from before the write: the database's expiry is no earlier than this
        try:
            async with self.sessions() as session, session.begin():
                got = await take(session, self.name, self.holder, self.length)
        except Exception:
            if self._sure_until is not None and asked >= self._sure_until:
                log.info("%s lease lost by %s: it could not be renewed in time", self.name, self.holder)
                self._sure_until = None
            raise
        if got != (self._sure_until is not None):
            log.info("%s lease %s by %s", self.name, "taken" if got else "lost", self.holder)
        self._sure_until = asked + self.length.total_seconds() if got else None
        return got

    def sure(self, margin: float = 0.0) -> bool:
        """Whether this process holds the lease for ``margin`` seconds more, for certain."""
        return self._sure_until is not None and _elapsed() + margin < self._sure_until

    async def _run(self) -> None:
        await _renewing(self.renew, self.length, f"{self.name} lease")  # sure() turns false once it may have lapsed

    async def give_up(self) -> None:
        if self._sure_until is None:
            return
        self._sure_until = None
        try:
            async with self.sessions() as session, session.begin():
                await give_up(session, self.name, self.holder)
        except Exception as exc:  # the database is gone: the lease runs out on its own
            log.warning("%s lease not given up (%s); it runs out in %s", self.name, exc, self.length)


def shard_of(guild_id: int | None, shard_count: int) -> int:
    """The shard Discord sends a guild's events on; turns with no guild go with shard 0."""
    return 0 if guild_id is None else (guild_id >> 22) % shard_count


class PostingShards(Background):
    """Which guilds' finished turns this process posts, so that each turn has one poster in a fleet.

    One lease per shard (``post:<shard>``). A process takes the leases of the shards it connects as their owner;
    where two processes connect every shard, whichever asks first holds each. It also stands in for a shard that no
    live process holds (its owner died: the lease ran out), until the owner is back, which takes it over at once.
    ``shards()`` says, when asked, how many shards the bot has and which it connects (None before it logs in).
    ``start()`` renews the leases on their own schedule until ``stop()``.
    """

    name = "animegamer-posting-leases"

    def __init__(
        self,
        sessions: Sessions,
        holder: str,
        seconds: float,
        shards: Callable[[], tuple[int, list[int]] | None],
        working: Working = _always_working,
    ) -> None:
        self.sessions, self.holder, self.shards = sessions, holder, shards
        self.length = timedelta(seconds=seconds)
        self.stuck = Stuck(working, self.length, "posting leases")
        self._count = 0
        self._sure_until: dict[int, float] = {}  # shard -> on _elapsed(), until when this process surely posts it
        self._from: dict[int, float] = {}  # shard -> on _elapsed(), from when (its previous holder's lease ran out)

    async def renew(self) -> None:
        known = self.shards()
        if known is None:
            return
        if self.stuck.now():
            if self._sure_until:
                await self.give_up()
            return
        count, connected = known
        others = [shard for shard in range(count) if shard not in connected]
        asked = _elapsed()
        async with self.sessions() as session, session.begin():
            now = await database_now(session)
            until = now + self.length
            await lock_in_order(session, [_post(s) for s in range(count)], now)
            mine = await take_many(session, [_post(s) for s in connected], self.holder, until, now, owner=True)
            standing = await take_many(session, [_post(s) for s in others], self.holder + STANDING_IN, until, now)
        held = {int(name.removeprefix(POST_PREFIX)): since for name, since in (mine | standing).items()}
        if set(held) != set(self._sure_until) or count != self._count:
            log.info("posting the turns of shards %s of %d (%s)", sorted(held) or "none", count, self.holder)
        self._count = count
        self._sure_until = dict.fromkeys(held, asked + self.length.total_seconds())
        # A shard taken from a live stand-in is posted once the stand-in's lease would have run out, and stays so.
        self._from = {
            shard: max(self._from.get(shard, -math.inf), asked + (since - now).total_seconds())
            for shard, since in held.items()
        }

    def posts(self, guild_id: int | None) -> bool:
        """Whether this process posts this guild's turns now, for certain: its hold on the guild's shard is live and
        this process is not stuck (asked right before each create-message, so a post that waited for its slot while
        the hold moved, or while Discord stopped answering this process, is left to the poster of the moment)."""
        if not self._count or self.stuck.seen():
            return False
        shard = shard_of(guild_id, self._count)
        return self._from.get(shard, math.inf) <= _elapsed() < self._sure_until.get(shard, -math.inf)

    async def _run(self) -> None:
        await _renewing(self.renew, self.length, "posting leases")  # posts() turns false once they may have lapsed

    async def give_up(self) -> None:
        self._sure_until, self._from = {}, {}
        try:
            async with self.sessions() as session, session.begin():
                await give_up_all(session, POST_PREFIX, [self.holder, self.holder + STANDING_IN])
        except Exception as exc:  # the database is gone: the leases run out on their own
            log.warning("posting leases not given up (%s); they run out in %s", exc, self.length)


POST_PREFIX = "post:"  # the lease of shard N's posts is "post:N"


def _post(shard: int) -> str:
    return f"{POST_PREFIX}{shard}"
