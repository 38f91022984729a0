"""Deletions the clip store owes: keys recorded in the transaction that clears them from their rows, removed once the
store has deleted their objects (``bot/clip_deletes.py`` does both halves, and retries what a store that was down
left). Nothing clears a key before its object is gone or its deletion is recorded here, so an object outlives an
outage of the store only until the store answers again."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from db.models import ClipDelete

# An owed key ending in this stands for every key under it then (a story's kept recaps: their versions are only known
# by listing the store, which a store that is down cannot do). No stored key ends in it.
EVERY = "*"


async def record(session: AsyncSession, keys: Iterable[str]) -> None:
    """Owe the deletion of ``keys`` (in the caller's transaction; a key owed already stays owed once)."""
    wanted = sorted(set(keys))
    if not wanted:
        return
    owed = set((await session.execute(select(ClipDelete.key).where(ClipDelete.key.in_(wanted)))).scalars())
    session.add_all(ClipDelete(key=key) for key in wanted if key not in owed)
    await session.flush()


async def owed(session: AsyncSession, limit: int = 1000) -> list[str]:
    """The oldest deletions still owed."""
    rows = await session.execute(select(ClipDelete.key).order_by(ClipDelete.created_at, ClipDelete.key).limit(limit))
    return list(rows.scalars())


async def done(session: AsyncSession, keys: Iterable[str]) -> None:
    """The store deleted these: nothing is owed for them any more."""
    gone = sorted(set(keys))
    if gone:
        await session.execute(delete(ClipDelete).where(ClipDelete.key.in_(gone)))


async def tried(session: AsyncSession, keys: Iterable[str]) -> None:
    """The store could not delete these now: counted, still owed."""
    failed = sorted(set(keys))
    if failed:
        await session.execute(
            update(ClipDelete).where(ClipDelete.key.in_(failed)).values(attempts=ClipDelete.attempts + 1)
        )


async def count(session: AsyncSession) -> int:
    return (await session.execute(select(func.count()).select_from(ClipDelete))).scalar_one()
