"""This process's hold on a duty that one bot process of the fleet does at a time (db/leases.py).

``keep()`` runs on its own schedule, beside the duty: every third of the lease it takes the lease when it is free
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
import os
import secrets
import socket
import time
from datetime import timedelta

from db.engine import Sessions
from db.leases import give_up, take

log = logging.getLogger(__name__)


def process_name() -> str:
    """Who holds a lease: the host and pid an operator can find, and a token no restarted process repeats."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _elapsed() -> float:
    """Seconds on a clock that no wall-clock change moves and that goes on while the machine sleeps (Linux's
    CLOCK_BOOTTIME; elsewhere the monotonic clock)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


class LeaseHold:
    def __init__(self, sessions: Sessions, name: str, holder: str, seconds: float) -> None:
        self.sessions = sessions
        self.name = name
        self.holder = holder
        self.length = timedelta(seconds=seconds)
        self._sure_until: float | None = None  # on _elapsed(): until when this process surely holds the lease

    async def renew(self) -> bool:
        """Take the lease, or renew it: True if this process holds it now."""
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

    async def keep(self) -> None:
        """Take or renew the lease every third of its length, until cancelled."""
        while True:
            try:
                await self.renew()
            except Exception as exc:  # the database is down: sure() turns false when the lease may have run out
                log.warning("%s lease not renewed (%s)", self.name, exc)
            await asyncio.sleep(self.length.total_seconds() / 3)

    async def give_up(self) -> None:
        if self._sure_until is None:
            return
        self._sure_until = None
        try:
            async with self.sessions() as session, session.begin():
                await give_up(session, self.name, self.holder)
        except Exception as exc:  # the database is gone: the lease runs out on its own
            log.warning("%s lease not given up (%s); it runs out in %s", self.name, exc, self.length)
