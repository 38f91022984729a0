"""The bot's side of the Celery queue: send a turn by name, read its state, never block the loop.

Celery's client calls are blocking, so each runs in a thread. Any broker or result-store error
becomes ``QueueUnavailable``: commands answer "the queue is unreachable" and the delivery loop
waits and retries, while commands that need no queue keep working.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from celery import Celery

from game.contract import TASK_NAME, TurnRequest


class QueueUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class TaskState:
    state: str  # PENDING | STARTED | PROGRESS | SUCCESS | FAILURE | REVOKED | RETRY
    info: Any  # progress meta, the result dict, or the exception


class TurnQueue:
    def __init__(self, app: Celery, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def send(self, request: TurnRequest, task_id: str, queue: str) -> None:
        def send() -> None:
            # No publish retries: a dead broker must be reported now, not in a minute.
            payload = [request.model_dump(mode="json")]
            self.app.send_task(TASK_NAME, args=payload, task_id=task_id, queue=queue, retry=False)

        await self._call(send)

    async def poll(self, task_id: str) -> TaskState:
        def read() -> TaskState:
            result = self.app.AsyncResult(task_id)
            return TaskState(result.state, result.info)

        return await self._call(read)

    async def forget(self, task_id: str) -> None:
        await self._call(lambda: self.app.AsyncResult(task_id).forget())

    async def revoke(self, task_id: str) -> None:
        await self._call(lambda: self.app.control.revoke(task_id))

    async def active_queues(self) -> list[str] | None:
        """The queues the running workers consume, or None where the broker cannot say (SQLite)."""

        def ask() -> list[str] | None:
            if not self.app.conf.broker_url.startswith(("redis", "amqp")):
                return None  # remote control needs a broadcast, which the SQLite transport lacks
            replies = self.app.control.inspect(timeout=1.0).active_queues() or {}
            return sorted({queue["name"] for queues in replies.values() for queue in queues})

        return await self._call(ask)

    async def _call(self, fn: Any) -> Any:
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn), timeout=self.timeout * 3)
        except Exception as exc:  # kombu, redis and sqlalchemy each raise their own kinds
            raise QueueUnavailable(f"{type(exc).__name__}: {exc}") from exc
