"""This process's hold on a duty that one bot process of the fleet does at a time (db/leases.py).

``held()`` is asked at each tick of the duty: it takes the lease when it is free, renews it when half of
it has run, and otherwise answers from memory, so the one process of the embedded default pays one write
every half lease. ``give_up()`` on a clean stop lets another process take the duty at its next tick; a
killed process's lease runs out after ``seconds``, the takeover bound.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from datetime import datetime, timedelta

from db.base import utcnow
from db.engine import Sessions
from db.leases import give_up, take

log = logging.getLogger(__name__)


def process_name() -> str:
    """Who holds a lease: the host and pid an operator can find, and a token no restarted process repeats."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class LeaseHold:
    def __init__(self, sessions: Sessions, name: str, holder: str, seconds: float) -> None:
        self.sessions = sessions
        self.name = name
        self.holder = holder
        self.length = timedelta(seconds=seconds)
        self._until: datetime | None = None  # while held: when it runs out unless renewed

    async def held(self) -> bool:
        now = utcnow()
        if self._until is not None and self._until - now > self.length / 2:
            return True
        async with self.sessions() as session, session.begin():
            got = await take(session, self.name, self.holder, now + self.length, now)
        if got != (self._until is not None):
            log.info("%s lease %s by %s", self.name, "taken" if got else "lost", self.holder)
        self._until = now + self.length if got else None
        return got

    @property
    def holding(self) -> bool:
        """Whether this process held the lease at its last ``held()`` and it has not run out since."""
        return self._until is not None and self._until > utcnow()

    async def give_up(self) -> None:
        if self._until is None:
            return
        self._until = None
        try:
            async with self.sessions() as session, session.begin():
                await give_up(session, self.name, self.holder, utcnow())
        except Exception as exc:  # the database is gone: the lease runs out on its own
            log.warning("%s lease not given up (%s); it runs out in %s", self.name, exc, self.length)
