"""Posted copies of clips: a /story recap and a /story page hold the clips of many turns in one message.

A copy is recorded once it is posted, naming the turns it holds (withdrawn at once if one of them lost its clip
while it was being made). Whatever takes a clip away (a removal, a player's
deletion, a purge, retention) calls ``withdraw`` in the transaction that clears the clip, so the copy is marked in
the same commit and its kept recap object is owed to the store (db/clip_deletes.py); ``bot/clip_copies.py``
deletes the message and drops the row, and every bot process retries what Discord did not take each minute.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from db import clip_deletes
from db.base import utcnow
from db.models import ClipCopy, Turn

RECAP = "recap"
PAGE = "page"


def _ids(turn_ids: Iterable[int]) -> str:
    return "," + ",".join(str(turn_id) for turn_id in sorted(set(turn_ids))) + ","


def _held(copy: ClipCopy) -> set[int]:
    return {int(part) for part in copy.turn_ids.strip(",").split(",") if part}


async def record(
    session: AsyncSession,
    kind: str,
    story_id: int,
    guild_id: int | None,
    channel_id: int,
    message_id: int,
    turn_ids: Iterable[int],
    recap_key: str | None = None,
) -> bool:
    """A copy just posted. Returns False when one of its clips was taken away while it was being made: it is
    recorded withdrawn at once, for the caller to take down."""
    held = sorted(set(turn_ids))
    still = 0
    for start in range(0, len(held), 500):
        still += (
            await session.execute(
                select(func.count()).where(Turn.id.in_(held[start : start + 500]), Turn.clip_key.is_not(None))
            )
        ).scalar_one()
    kept = still == len(held)
    session.add(
        ClipCopy(
            kind=kind,
            story_id=story_id,
            guild_id=guild_id,
            channel_id=channel_id,
            message_id=message_id,
            turn_ids=_ids(held),
            recap_key=recap_key,
            withdrawn_at=None if kept else utcnow(),
        )
    )
    if not kept and recap_key:
        await clip_deletes.record(session, [recap_key])
    await session.flush()
    return kept


async def withdraw(session: AsyncSession, turn_ids: Sequence[int]) -> tuple[int, list[str]]:
    """Mark every copy holding one of ``turn_ids`` withdrawn (in the caller's transaction, before the turns are
    deleted) and owe the deletion of their kept recap objects; returns how many were withdrawn now and the keys of
    those recap objects, for the caller to delete once this commits."""
    if not turn_ids:
        return 0, []
    gone = set(turn_ids)
    stories = set()
    for start in range(0, len(turn_ids), 500):
        rows = await session.execute(
            select(Turn.story_id).where(Turn.id.in_(turn_ids[start : start + 500]), Turn.story_id.is_not(None))
        )
        stories.update(rows.scalars())
    if not stories:
        return 0, []
    copies = (
        await session.execute(
            select(ClipCopy).where(ClipCopy.story_id.in_(sorted(stories)), ClipCopy.withdrawn_at.is_(None))
        )
    ).scalars()
    hit = [copy for copy in copies if _held(copy) & gone]
    if not hit:
        return 0, []
    await session.execute(
        update(ClipCopy).where(ClipCopy.id.in_([copy.id for copy in hit])).values(withdrawn_at=utcnow())
    )
    keys = sorted({copy.recap_key for copy in hit if copy.recap_key})
    await clip_deletes.record(session, keys)
    return len(hit), keys


async def withdrawn(session: AsyncSession, limit: int = 100) -> list[ClipCopy]:
    """Withdrawn copies whose messages may still be up, oldest first."""
    rows = await session.execute(
        select(ClipCopy).where(ClipCopy.withdrawn_at.is_not(None)).order_by(ClipCopy.id).limit(limit)
    )
    return list(rows.scalars())


async def taken_down(session: AsyncSession, copy_ids: Iterable[int]) -> None:
    """Their messages are gone (or never were posted): nothing is left to do for them."""
    done = sorted(set(copy_ids))
    if done:
        await session.execute(delete(ClipCopy).where(ClipCopy.id.in_(done)))
