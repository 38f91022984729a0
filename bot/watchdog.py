"""How late the event loop runs: a timer that should fire every ``interval`` and notes how late it was.

Everything the bot does shares one event loop with discord.py's gateway; a blocking call on it
(a synchronous broker call, a big file read) delays every command and, past the heartbeat
interval, the gateway itself. This measures that delay from inside, so tests can assert it and
operators see it in the log.
"""

from __future__ import annotations

import asyncio
import logging
import time

from bot.background import Background

log = logging.getLogger(__name__)

WARN_SECONDS = 0.5  # a stall this long is logged: commands waited that long for nothing


class LoopWatch(Background):
    name = "animegamer-loop-watch"

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.longest = 0.0  # seconds: the longest stall seen since start (or the last reset)
        self.beat_at: float | None = None  # time.monotonic() when the loop last ran this timer

    def reset(self) -> float:
        longest, self.longest = self.longest, 0.0
        return longest

    async def _run(self) -> None:
        while True:
            before = self.beat_at = time.monotonic()  # read by the liveness watchdog's thread (bot/liveness.py)
            await asyncio.sleep(self.interval)
            late = time.monotonic() - before - self.interval
            if late > self.longest:
                self.longest = late
            if late > WARN_SECONDS:
                log.warning("the event loop stalled for %.2fs", late)
