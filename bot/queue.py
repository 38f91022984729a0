"""The bot's side of the queue: send turns by name, look at them, cancel them, never block the loop.

Celery's client calls and the result store's are blocking, so each runs in a thread of this
queue's own small pool (a broker that hangs fills it, not the default executor that file work
and discord.py share), under a timeout. Any broker or store error becomes ``QueueUnavailable``,
and for ``timeout`` seconds after one the queue answers ``QueueUnavailable`` at once instead of
waiting on a dead server again: commands say so in milliseconds and the supervisor retries
later, while everything that needs no queue keeps working.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from celery import Celery, states

from game.contract import TASK_NAME, TurnRequest
from game.jobs import Seen
from relay.celery_app import check_broker
from relay.control import Holder, JobControl, Presence, control_for

log = logging.getLogger(__name__)

T = TypeVar("T")

THREADS = 4
CANCEL_KEEP_SECONDS = 7 * 24 * 3600.0  # a cancel mark outlives any message that could still carry the turn


class QueueUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Look:
    """One job as the worker side shows it: what it means for the job, and the stored state."""

    seen: Seen
    state: str  # Celery's: PENDING | STARTED | PROGRESS | SUCCESS | FAILURE | REVOKED | RETRY
    info: Any  # progress meta, the result dict, or the exception


def seen_from(state: str, holder: Holder) -> Seen:
    """What a stored Celery state and a claim mean for the job's lifecycle.

    Progress alone proves nothing (a killed worker's last PROGRESS stays in the store for good);
    only a claim its worker keeps renewing does.
    """
    if state == states.SUCCESS:
        return Seen.SUCCEEDED
    if state in (states.FAILURE, states.REVOKED):
        return Seen.FAILED
    if holder is Holder.HELD:
        return Seen.WORKING
    if holder is Holder.ENDED:
        return Seen.ENDED
    return Seen.NOTHING


class TurnQueue:
    def __init__(self, app: Celery, timeout: float) -> None:
        self.app = app
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="animegamer-queue")
        self._down_until = 0.0
        self._control: JobControl | None = None
        self._broker_client: Any = None  # a Redis client on the broker, to read its uptime

    @property
    def control(self) -> JobControl:
        if self._control is None:
            self._control = control_for(self.app.conf.result_backend, self.timeout)
        return self._control

    async def send(self, request: TurnRequest, task_id: str, queue: str) -> None:
        def send() -> None:
            # No publish retries: a dead broker must be reported now; the outbox tries again later.
            payload = [request.model_dump(mode="json")]
            # What events (Flower) and worker logs show of the arguments: the job, not the player's words.
            shown = f"[job {request.job_id}]"
            self.app.send_task(TASK_NAME, args=payload, task_id=task_id, queue=queue, retry=False, argsrepr=shown)

        await self._call(send)

    async def look(self, task_ids: list[str]) -> dict[str, Look]:
        """How each job is doing: its claim and its stored state, read in one thread call."""

        def read() -> dict[str, Look]:
            holders = self.control.holders(task_ids)
            looks = {}
            for task_id in task_ids:
                meta = self.app.backend.get_task_meta(task_id, cache=False)  # a clip per result: never kept here
                state, info = meta.get("status", states.PENDING), meta.get("result")
                looks[task_id] = Look(seen_from(state, holders[task_id]), state, info)
            return looks

        return await self._call(read) if task_ids else {}

    async def forget(self, task_id: str) -> None:
        await self._call(lambda: self.app.AsyncResult(task_id).forget())

    async def clean_store(self) -> int:
        """Delete the result store's expired rows; how many claims and cancel marks went.

        Celery's database backend keeps every result (and every PROGRESS a cancelled turn left)
        until its ``cleanup`` runs, which only celery beat would call; Redis expires its keys
        itself (``result_expires``). Runs in a thread of its own, not the queue's pool: a long
        delete must not make the queue look down to commands.
        """

        def clean() -> int:
            self.app.backend.cleanup()
            return self.control.purge_expired()

        return await asyncio.to_thread(clean)

    async def cancel(self, task_id: str) -> None:
        """Tell the workers: the mark both brokers' workers check, and Celery's revoke where it is heard."""

        def cancel() -> None:
            self.control.cancel(task_id, CANCEL_KEEP_SECONDS)
            if self.app.conf.broker_url.startswith(("redis", "amqp")):
                self.app.control.revoke(task_id)  # a broadcast; the SQLite transport has none

        await self._call(cancel)

    async def withdraw(self, task_ids: Sequence[str]) -> int:
        """Take turns no worker has taken yet out of the broker's queues (Redis), so that a deleted player's turn
        leaves no message behind; returns how many were taken out. (The SQLite broker's rows go with the job's: a
        queued turn there is dropped by its worker, which finds the cancel mark.)"""
        if not task_ids or not self.broker_is_redis:
            return 0
        return len(await self._call(lambda: self._in_queues(set(task_ids), take=True)))

    async def still_queued(self, task_ids: Sequence[str]) -> set[str]:
        """Those of ``task_ids`` whose message waits in the broker's queues (Redis): sent, and no worker took it."""
        if not task_ids or not self.broker_is_redis:
            return set()
        return await self._call(lambda: self._in_queues(set(task_ids), take=False))

    def _in_queues(self, wanted: set[str], take: bool) -> set[str]:
        """The wanted task ids found in the game's queue lists (``<queue>``, ``<queue>.<character>``), taken out
        of them when ``take``."""
        client = self._broker_redis()
        found: set[str] = set()
        for key in client.scan_iter(match=f"{self.app.conf.task_default_queue}*", count=500, _type="list"):
            for raw in client.lrange(key, 0, -1):
                try:
                    task_id = json.loads(raw)["headers"]["id"]
                except (ValueError, KeyError, TypeError):
                    continue  # not a Celery message: not ours to judge
                if task_id in wanted and (not take or client.lrem(key, 1, raw)):
                    found.add(task_id)
        return found

    async def release(self, task_id: str, holder: str) -> bool:
        """Forget a job's claim before it is sent again, only if ``holder`` still holds it (see JobControl)."""
        return await self._call(lambda: self.control.release(task_id, holder))

    @property
    def broker_is_redis(self) -> bool:
        return self.app.conf.broker_url.startswith(("redis://", "rediss://"))

    def _broker_redis(self) -> Any:
        """A Redis client on the broker itself (made once, in the queue's threads)."""
        if self._broker_client is None:
            import redis

            self._broker_client = redis.Redis.from_url(
                self.app.conf.broker_url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
            )
        return self._broker_client

    async def broker_uptime(self) -> timedelta | None:
        """How long since the broker last started, for a broker that forgets its queue on restart (Redis).

        None where messages outlive a restart (the SQLite broker keeps them in its file) or where
        the broker cannot say. Messages sent before it started that no worker holds are lost. A span, not an
        instant, so that the supervisor places it on the fleet's clock, not this process's.
        """
        if not self.broker_is_redis:
            return None

        def ask() -> timedelta:
            uptime = float(self._broker_redis().info("server")["uptime_in_seconds"])
            return timedelta(seconds=uptime + 1)  # whole seconds: err towards earlier

        return await self._call(ask)

    async def broker_memory(self) -> tuple[int, int] | None:
        """The Redis broker's memory in use and its ``maxmemory`` (0: no limit), in bytes; None for another broker,
        or when Redis does not say (an ACL that denies INFO, a Redis-compatible server without these fields).

        A broker at its limit refuses every send (``noeviction``): the turns wait in the outbox, and the operator
        is paged before that (the alert on these two). Asked beside the queue's calls, never through ``_call``: a
        broker that will not say is no reason to cool the queue down."""
        if not self.broker_is_redis or not self.available:
            return None

        def ask() -> tuple[int, int] | None:
            try:
                memory = self._broker_redis().info("memory")
                return int(memory["used_memory"]), int(memory.get("maxmemory", 0))
            except Exception as exc:  # redis's errors, a missing field
                log.debug("broker memory not read: %r", exc)
                return None

        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool, ask), timeout=self.timeout * 3)
        except TimeoutError:
            return None

    async def workers(self) -> list[Presence]:
        return await self._call(lambda: self.control.workers())

    async def ping(self) -> None:
        """Reach the broker (and a Redis result store): an idle bot sends nothing, yet readiness must be true."""
        await self._call(lambda: check_broker(self.app, self.timeout))

    @property
    def available(self) -> bool:
        """False while the queue is cooling down after a failure."""
        return time.monotonic() >= self._down_until

    async def _call(self, fn: Callable[[], T]) -> T:
        if not self.available:
            raise QueueUnavailable("the queue did not answer a moment ago")
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool, fn), timeout=self.timeout * 3)
        except Exception as exc:  # kombu, redis and sqlalchemy each raise their own kinds
            self._down_until = time.monotonic() + self.timeout  # a cool-down as long as one wait
            raise QueueUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
