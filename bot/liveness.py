"""Whether this bot process is working, not only running: what /livez answers and what its duties' renewals ask.

A process can be alive and stuck: its event loop blocked by a synchronous call, a round of its supervisor waiting on
a call that never returns, or Discord's REST holding every request it makes while its gateway and its database work.
It then keeps answering /healthz, and before this kept every duty it held (the outbox, its shards' posts) while doing
none of them. Three measures say which, each from the process's monotonic clock:

- the loop's lag: how long since the loop last ran ``LoopWatch``'s timer, measured from a thread of its own (as
  discord.py's heartbeat thread measures its loop), which logs the loop thread's stack once when the loop is blocked;
- each duty loop's round in progress: how long it has run (0 between rounds);
- Discord's REST: how long since it last answered, while this process has asked it something lately.

``working(deadline)`` is what the duties' holds ask before each renewal (bot/leases.py): a process stuck for the
renew deadline gives its duties up. ``live()`` is /livez: stuck for ``ANIMEGAMER_LIVENESS_SECONDS`` fails it, and an
orchestrator restarts the process. Neither reads Redis or the database: a server that is down makes the process
unready (bot/health.py), never dead, since restarting it would not bring the server back.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import aiohttp

from bot.background import Background

log = logging.getLogger(__name__)


class RestWatch:
    """How long Discord's REST has left this process unanswered, from aiohttp's trace of discord.py's session.

    Any response (an error status included) is an answer. A request that times out or fails leaves the process
    unanswered since it was made, until some later request is answered; a process that has asked nothing for
    ``quiet`` seconds is not waiting on anyone, so it does not count as stalled however its last request ended.
    """

    def __init__(self, quiet: float) -> None:
        self.quiet = quiet
        self._in_flight = 0
        self._unanswered_since: float | None = None  # the first request made since Discord last answered
        self._asked_at = -float("inf")  # the last request made, or given up

    def hook(self, trace: aiohttp.TraceConfig) -> None:
        trace.on_request_start.append(self._started)
        trace.on_request_end.append(self._answered)
        trace.on_request_exception.append(self._failed)

    def stalled_for(self) -> float:
        now = time.monotonic()
        since = self._unanswered_since
        if since is None or (self._in_flight == 0 and now - self._asked_at > self.quiet):
            return 0.0
        return now - since

    async def _started(self, _session: Any, _context: SimpleNamespace, _params: Any) -> None:
        now = self._asked_at = time.monotonic()
        self._in_flight += 1
        if self._unanswered_since is None:
            self._unanswered_since = now

    async def _answered(self, _session: Any, _context: SimpleNamespace, _params: Any) -> None:
        self._in_flight -= 1
        # The requests still waiting are counted from now: Discord answers this process.
        self._unanswered_since = time.monotonic() if self._in_flight else None

    async def _failed(self, _session: Any, _context: SimpleNamespace, _params: Any) -> None:
        self._in_flight -= 1
        self._asked_at = time.monotonic()


class Liveness:
    """The measures above, read from any thread; ``start()`` runs the watchdog thread that logs a blocked loop."""

    def __init__(self, beat_at: Callable[[], float | None], duties: Mapping[str, Background], rest: RestWatch) -> None:
        self.beat_at, self.duties, self.rest = beat_at, duties, rest
        self._loop_thread: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lag(self) -> float:
        """Seconds since the event loop last ran its watch's timer (0 before it first ran)."""
        beat = self.beat_at()
        return 0.0 if beat is None else max(0.0, time.monotonic() - beat)

    def stuck(self, seconds: float) -> list[str]:
        """What has been stuck for ``seconds`` or more, in a few words each (empty: working)."""
        said = []
        if (lag := self.lag()) >= seconds:
            said.append(f"the event loop has been blocked for {lag:.0f} s")
        for name, duty in self.duties.items():
            if (overrun := duty.overrun()) >= seconds:
                said.append(f"a round of the {name} has run for {overrun:.0f} s")
        if (stalled := self.rest.stalled_for()) >= seconds:
            said.append(f"Discord's REST has not answered for {stalled:.0f} s")
        return said

    def working(self, deadline: float) -> str | None:
        """None while nothing has been stuck for ``deadline``; else why, for a duty's hold to give the duty up."""
        said = self.stuck(deadline)
        return "; ".join(said) if said else None

    def report(self, seconds: float) -> tuple[bool, dict[str, Any]]:
        """/livez: alive unless something has been stuck for ``seconds``; the body says each measure."""
        stuck = self.stuck(seconds)
        return not stuck, {
            "live": not stuck,
            "stuck": stuck,
            "loop_lag_seconds": round(self.lag(), 2),
            "round_seconds": {name: round(duty.overrun(), 1) for name, duty in self.duties.items()},
            "discord_unanswered_seconds": round(self.rest.stalled_for(), 1),
            "limit_seconds": seconds,
        }

    # -- the watchdog thread ------------------------------------------------------------------------

    def start(self, blocked_after: float) -> None:
        """Watch the calling thread's loop: when it has been blocked for ``blocked_after``, log its stack, once
        per blockage (what it is stuck in is what an operator needs, and it is gone once the loop runs again)."""
        self._loop_thread = threading.get_ident()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, args=(blocked_after,), name="animegamer-loop-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _watch(self, blocked_after: float) -> None:
        told = False
        while not self._stop.wait(min(1.0, blocked_after / 4)):
            lag = self.lag()
            if lag < blocked_after:
                told = False
            elif not told:
                told = True
                frame = sys._current_frames().get(self._loop_thread or 0)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(not found)\n"
                log.error(
                    "the event loop has been blocked for %.1f s; loop thread traceback (most recent call last):\n%s",
                    lag,
                    stack.rstrip(),
                )
