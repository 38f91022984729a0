"""Which workers are live, read from their announcements: how many consume each queue, and (published model)
which characters some live worker plays; and, read beside them, how full a Redis broker is (for the metrics).

Every bot process reads it for itself, at most every ``REFRESH_SECONDS``; nothing is written, so a fleet needs no
owner for it. The outbox sizes each queue's window from it; /act refuses a character no worker plays.
"""

from __future__ import annotations

import time
from collections import Counter

from bot.queue import QueueUnavailable, TurnQueue
from relay.celery_app import RELEASE_MODEL, queue_for
from relay.settings import Settings

REFRESH_SECONDS = 10.0


class WorkerPresence:
    def __init__(self, settings: Settings, queue: TurnQueue) -> None:
        self.settings = settings
        self.queue = queue
        # The published model is one MLLM + decoder pair per character, each on its own queue: the
        # characters some live worker serves, as the workers announce them. Any name otherwise.
        self.served: list[str] | None = list(settings.characters) if settings.model == RELEASE_MODEL else None
        self.workers_on: Counter[str] = Counter()  # queue -> live workers consuming it
        self.queue_answers: bool | None = None  # at the last call that needed it; None: not asked yet
        self.broker_memory: tuple[int, int] | None = None  # a Redis broker's bytes used and maxmemory, when read
        self._read_at = float("-inf")

    async def refresh(self) -> None:
        if time.monotonic() - self._read_at < REFRESH_SECONDS:
            return
        try:
            await self.queue.ping()
            presences = await self.queue.workers()
        except QueueUnavailable:
            self.queue_answers = False
            return  # keep what was known
        self.queue_answers = True
        self.workers_on = Counter(queue for presence in presences for queue in presence.queues)
        self.broker_memory = await self.queue.broker_memory()
        if self.served is not None:
            characters = self.settings.characters
            self.served = [name for name in characters if queue_for(self.settings, name) in self.workers_on]
        self._read_at = time.monotonic()
