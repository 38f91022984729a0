"""A task the bot runs beside discord.py for as long as it runs: started in setup_hook, stopped on close.

Each notes when its last tick succeeded (``ticked``), which readiness (bot/health.py) reads: a duty that has
stopped ticking (its database gone, a bug in a loop) makes the bot unready rather than silently idle. A loop also
says when a round begins and ends (``began``, ``ended``), which liveness (bot/liveness.py) and its duties' holds
read: a round that has run too long is a loop stuck on something, not a loop waiting for its next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class Background:
    """Subclasses write ``_run``; ``start`` and ``stop`` are symmetric, so no task outlives the bot."""

    name = "animegamer-background"
    _task: asyncio.Task[None] | None = None
    ticked_at: float | None = None  # time.monotonic() when its last tick succeeded
    _began: float | None = None  # time.monotonic() when the round in progress began; None between rounds

    def ticked(self) -> None:
        self.ticked_at = time.monotonic()

    def began(self) -> None:
        self._began = time.monotonic()

    def ended(self) -> None:
        self._began = None

    def overrun(self) -> float:
        """Seconds the round in progress has run; 0 between rounds (waiting for the next is not being stuck)."""
        began = self._began
        return 0.0 if began is None else time.monotonic() - began

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._began = None

    async def _run(self) -> None:
        raise NotImplementedError
