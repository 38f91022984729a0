"""A task the bot runs beside discord.py for as long as it runs: started in setup_hook, stopped on close."""

from __future__ import annotations

import asyncio
import contextlib


class Background:
    """Subclasses write ``_run``; ``start`` and ``stop`` are symmetric, so no task outlives the bot."""

    name = "animegamer-background"
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        raise NotImplementedError
