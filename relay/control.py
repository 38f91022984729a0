"""What the bot and the workers tell each other about a job, beside the queue: claims, cancel marks, presence.

The broker alone cannot say these things on both brokers: Celery's revoke is a broadcast the
SQLite transport never delivers, a message handed out twice (a resend from the outbox, a
redelivery after a lost worker) would run twice, and a worker that died says nothing. So both
sides share three small records in the result store (Redis keys, or tables beside Celery's in
the SQL result database):

- a **claim** per job: a worker takes it before it runs the turn (one claim per job id, so a
  second delivery of the same task is dropped), renews it while it works (a claim
  that is not renewed lapses, which is how the bot learns a worker vanished), and marks it
  ended when the turn is over;
- a **cancel mark** per job: the bot sets it; a worker checks it before it starts and at
  every step of the turn, and stops;
- a **presence** record per worker, renewed with its claims: which queues it serves, so the
  bot can tell players which characters are being served right now.

Every call is short and synchronous with its own timeouts; the bot runs them in a thread.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

ENDED = "ended"  # the claim's holder once the turn is over, whatever its outcome
PREFIX = "animegamer"


class Claim(enum.StrEnum):
    CLAIMED = "claimed"  # this worker runs the turn
    CANCELLED = "cancelled"  # the player cancelled it: never compute it
    TAKEN = "taken"  # another delivery holds it, or it already ended: drop this one


class Holder(enum.StrEnum):
    """A job's claim as the bot sees it."""

    ABSENT = "absent"  # nobody holds it: still queued, or its worker's claim lapsed
    HELD = "held"  # a worker holds it and renews it
    ENDED = "ended"  # its worker is done with it


@dataclass(frozen=True)
class Presence:
    worker: str
    queues: tuple[str, ...]
    model: str | None = None  # its ANIMEGAMER_MODEL (None: a worker older than this field)

    @classmethod
    def read(cls, worker: str, stored: str | bytes) -> Presence:
        value = json.loads(stored)
        if isinstance(value, list):  # as workers announced themselves before they said their model
            return cls(worker, tuple(value))
        return cls(worker, tuple(value["queues"]), value.get("model"))

    def stored(self) -> str:
        return json.dumps({"queues": list(self.queues), "model": self.model})


class JobControl:
    """The interface both stores implement."""

    def claim(self, task_id: str, owner: str, ttl: float) -> Claim:
        raise NotImplementedError

    def renew(self, task_ids: Iterable[str], owner: str, ttl: float) -> set[str]:
        """Extend this worker's claims (making them again if the store lost them, e.g. a Redis restart).

        Returns the ones it lost: another worker holds them (its claim lapsed while it was frozen or cut off,
        and the bot handed the turn to another) or they ended. Its turn stops at the next step.
        """
        raise NotImplementedError

    def end(self, task_id: str, owner: str, keep: float) -> bool:
        """Mark the claim ended, only if ``owner`` holds it (or nobody does): never another worker's claim."""
        raise NotImplementedError

    def release(self, task_id: str, holder: str) -> bool:
        """Forget a job's claim, so that sending it again lets a worker run it, only if ``holder`` still holds it.

        Compare and delete, as one step: the holder is what the caller read (a stopping worker its own id, the bot
        ENDED for a turn whose result was lost). A caller that read it seconds ago, and paused since, would
        otherwise delete the live claim of a worker that took the turn meanwhile, and the turn would run twice.
        """
        raise NotImplementedError

    def cancel(self, task_id: str, keep: float) -> None:
        raise NotImplementedError

    def cancelled(self, task_id: str) -> bool:
        raise NotImplementedError

    def holders(self, task_ids: list[str]) -> dict[str, Holder]:
        raise NotImplementedError

    def announce(self, presence: Presence, ttl: float) -> None:
        raise NotImplementedError

    def workers(self) -> list[Presence]:
        raise NotImplementedError

    def purge_expired(self) -> int:
        """Delete records past their expiry; how many went. Redis expires its keys itself."""
        return 0

    def close(self) -> None:
        """Drop connections (a forked child must not share its parent's sockets)."""


# --------------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------------

# Set a claim (renew it, or end it) only if this worker holds it or nobody does (a restarted Redis lost
# it); never overwrite another holder or an ended claim. ARGV: the worker, the new value, its lifetime (ms).
_SET_IF_MINE = """
local held = redis.call('GET', KEYS[1])
if held == false or held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


# Delete a claim only if it still holds ARGV[1].
_DELETE_IF = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisControl(JobControl):
    def __init__(self, url: str, timeout: float) -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._set_if_mine = self._client.register_script(_SET_IF_MINE)
        self._delete_if = self._client.register_script(_DELETE_IF)

    @staticmethod
    def _claim_key(task_id: str) -> str:
        return f"{PREFIX}:claim:{task_id}"

    @staticmethod
    def _cancel_key(task_id: str) -> str:
        return f"{PREFIX}:cancel:{task_id}"

    def claim(self, task_id: str, owner: str, ttl: float) -> Claim:
        if self._client.exists(self._cancel_key(task_id)):
            return Claim.CANCELLED
        if self._client.set(self._claim_key(task_id), owner, nx=True, px=_ms(ttl)):
            return Claim.CLAIMED
        return Claim.TAKEN

    def renew(self, task_ids: Iterable[str], owner: str, ttl: float) -> set[str]:
        args = [owner, owner, _ms(ttl)]
        return {t for t in task_ids if not self._set_if_mine(keys=[self._claim_key(t)], args=args)}

    def end(self, task_id: str, owner: str, keep: float) -> bool:
        return bool(self._set_if_mine(keys=[self._claim_key(task_id)], args=[owner, ENDED, _ms(keep)]))

    def release(self, task_id: str, holder: str) -> bool:
        return bool(self._delete_if(keys=[self._claim_key(task_id)], args=[holder]))

    def cancel(self, task_id: str, keep: float) -> None:
        self._client.set(self._cancel_key(task_id), "1", px=_ms(keep))

    def cancelled(self, task_id: str) -> bool:
        return bool(self._client.exists(self._cancel_key(task_id)))

    def holders(self, task_ids: list[str]) -> dict[str, Holder]:
        if not task_ids:
            return {}
        values = self._client.mget([self._claim_key(t) for t in task_ids])
        return {t: _holder(v.decode() if v is not None else None) for t, v in zip(task_ids, values, strict=True)}

    def announce(self, presence: Presence, ttl: float) -> None:
        self._client.set(f"{PREFIX}:worker:{presence.worker}", presence.stored(), px=_ms(ttl))

    def workers(self) -> list[Presence]:
        keys = sorted(self._client.scan_iter(match=f"{PREFIX}:worker:*", count=100))
        values = self._client.mget(keys) if keys else []
        prefix = len(f"{PREFIX}:worker:")
        return [
            Presence.read(key.decode()[prefix:], value)
            for key, value in zip(keys, values, strict=True)
            if value is not None
        ]

    def close(self) -> None:
        self._client.connection_pool.disconnect()


# --------------------------------------------------------------------------------------------
# SQL (the embedded SQLite result store, or any SQLAlchemy URL Celery's database backend takes)
# --------------------------------------------------------------------------------------------


class SqlControl(JobControl):
    """Three tables beside Celery's own in its result database; expiry times are unix seconds."""

    def __init__(self, url: str, timeout: float) -> None:
        from sqlalchemy import Column, Float, MetaData, String, Table, Text, create_engine, event

        connect_args: dict[str, Any] = {"timeout": timeout} if url.startswith("sqlite") else {}
        self._engine = create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        if self._engine.dialect.name == "sqlite":

            @event.listens_for(self._engine, "connect")
            def _wal(dbapi_connection: Any, _record: Any) -> None:
                # Workers write claims while the bot reads them: WAL keeps readers off the writer's lock.
                dbapi_connection.execute("PRAGMA journal_mode=WAL")

        meta = MetaData()
        self._claims = Table(
            f"{PREFIX}_claims",
            meta,
            Column("task_id", String(64), primary_key=True),
            Column("holder", String(200), nullable=False),
            Column("expires", Float, nullable=False),
        )
        self._cancels = Table(
            f"{PREFIX}_cancels",
            meta,
            Column("task_id", String(64), primary_key=True),
            Column("expires", Float, nullable=False),
        )
        self._workers = Table(
            f"{PREFIX}_workers",
            meta,
            Column("worker", String(200), primary_key=True),
            Column("queues", Text, nullable=False),
            Column("expires", Float, nullable=False),
        )
        self._meta = meta
        self._ready = False
        self._lock = threading.Lock()

    def _begin(self) -> Any:
        if not self._ready:
            with self._lock:
                if not self._ready:
                    self._meta.create_all(self._engine, checkfirst=True)
                    self._ready = True
        return self._engine.begin()

    def claim(self, task_id: str, owner: str, ttl: float) -> Claim:
        from sqlalchemy import select
        from sqlalchemy.exc import IntegrityError

        now = time.time()
        with self._begin() as conn:
            if conn.execute(select(self._cancels.c.task_id).where(self._cancels.c.task_id == task_id)).first():
                return Claim.CANCELLED
            taken = conn.execute(
                self._claims.update()
                .where(
                    self._claims.c.task_id == task_id,
                    self._claims.c.holder != ENDED,
                    self._claims.c.expires < now,
                )
                .values(holder=owner, expires=now + ttl)
            ).rowcount
            if taken:
                return Claim.CLAIMED  # a lapsed claim: its worker is gone
            exists = conn.execute(select(self._claims.c.task_id).where(self._claims.c.task_id == task_id)).first()
            if exists:
                return Claim.TAKEN
            try:
                conn.execute(self._claims.insert().values(task_id=task_id, holder=owner, expires=now + ttl))
            except IntegrityError:
                return Claim.TAKEN  # another worker inserted it first
            return Claim.CLAIMED

    def renew(self, task_ids: Iterable[str], owner: str, ttl: float) -> set[str]:
        expires, lost = time.time() + ttl, set()
        with self._begin() as conn:
            for task_id in task_ids:
                updated = conn.execute(
                    self._claims.update()
                    .where(self._claims.c.task_id == task_id, self._claims.c.holder == owner)
                    .values(expires=expires)
                ).rowcount
                if updated:
                    continue
                if conn.execute(self._claims.select().where(self._claims.c.task_id == task_id)).first():
                    lost.add(task_id)  # another worker's now, or ended
                else:
                    conn.execute(self._claims.insert().values(task_id=task_id, holder=owner, expires=expires))
        return lost

    def end(self, task_id: str, owner: str, keep: float) -> bool:
        from sqlalchemy.exc import IntegrityError

        values = {"holder": ENDED, "expires": time.time() + keep}
        with self._begin() as conn:
            claims = self._claims
            mine = claims.c.task_id == task_id, claims.c.holder == owner
            if conn.execute(claims.update().where(*mine).values(**values)).rowcount:
                return True
            if conn.execute(claims.select().where(claims.c.task_id == task_id)).first():
                return False  # another worker's claim: not ours to end
            try:
                conn.execute(claims.insert().values(task_id=task_id, **values))
            except IntegrityError:
                return False
            return True

    def release(self, task_id: str, holder: str) -> bool:
        claims = self._claims
        with self._begin() as conn:
            return bool(
                conn.execute(claims.delete().where(claims.c.task_id == task_id, claims.c.holder == holder)).rowcount
            )

    def cancel(self, task_id: str, keep: float) -> None:
        self._upsert(self._cancels, task_id, expires=time.time() + keep)

    def cancelled(self, task_id: str) -> bool:
        from sqlalchemy import select

        with self._begin() as conn:
            return (
                conn.execute(select(self._cancels.c.task_id).where(self._cancels.c.task_id == task_id)).first()
                is not None
            )

    def holders(self, task_ids: list[str]) -> dict[str, Holder]:
        from sqlalchemy import select

        if not task_ids:
            return {}
        now = time.time()
        with self._begin() as conn:
            rows = conn.execute(
                select(self._claims.c.task_id, self._claims.c.holder, self._claims.c.expires).where(
                    self._claims.c.task_id.in_(task_ids)
                )
            ).all()
        found = {t: holder for t, holder, expires in rows if holder == ENDED or expires >= now}
        return {t: _holder(found.get(t)) for t in task_ids}

    def announce(self, presence: Presence, ttl: float) -> None:
        with self._begin() as conn:
            table, worker = self._workers, presence.worker
            now = time.time()
            conn.execute(table.delete().where((table.c.worker == worker) | (table.c.expires < now)))
            conn.execute(table.insert().values(worker=worker, queues=presence.stored(), expires=now + ttl))

    def workers(self) -> list[Presence]:
        from sqlalchemy import select

        with self._begin() as conn:
            rows = conn.execute(
                select(self._workers.c.worker, self._workers.c.queues)
                .where(self._workers.c.expires >= time.time())
                .order_by(self._workers.c.worker)
            ).all()
        return [Presence.read(worker, queues) for worker, queues in rows]

    def purge_expired(self) -> int:
        """Delete what Redis would have expired by now (its keys carry the same times); else every job's rows stay."""
        now = time.time()
        with self._begin() as conn:
            return sum(
                conn.execute(table.delete().where(table.c.expires < now)).rowcount
                for table in (self._claims, self._cancels, self._workers)
            )

    def close(self) -> None:
        self._engine.dispose(close=False)

    def _upsert(self, table: Any, task_id: str, **values: Any) -> None:
        with self._begin() as conn:
            if not conn.execute(table.update().where(table.c.task_id == task_id).values(**values)).rowcount:
                conn.execute(table.insert().values(task_id=task_id, **values))


# --------------------------------------------------------------------------------------------


def control_for(result_backend: str, timeout: float) -> JobControl:
    """The shared records live wherever Celery keeps results: Redis, or a SQL database."""
    if result_backend.startswith(("redis://", "rediss://", "unix://")):
        return RedisControl(result_backend, timeout)
    if result_backend.startswith("db+"):
        return SqlControl(result_backend.removeprefix("db+"), timeout)
    raise ValueError(
        f"the result store {result_backend.split('://')[0]}:// cannot hold job claims; "
        "use redis:// or a db+ SQL URL for ANIMEGAMER_RESULT_BACKEND"
    )


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _holder(value: str | None) -> Holder:
    if value is None:
        return Holder.ABSENT
    return Holder.ENDED if value == ENDED else Holder.HELD
