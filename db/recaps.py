"""/story recap's claim: one recap of a story at a time, and one per cooldown, across every bot process.

A recap joins and re-encodes a whole story (up to a minute of CPU), so the cooldown and the recap being
made are rows, not a process's memory: the claim is one UPDATE guarded by both, and of two processes
asking at once exactly one makes it. A claim whose process died is stale after ``stale`` and may be taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from db.models import Story


@dataclass(frozen=True)
class RecapClaim:
    claimed: bool
    busy: bool = False  # another recap of this story is being made
    again_at: datetime | None = None  # cooling down: when the next recap may be asked for


async def claim_recap(
    session: AsyncSession, story_id: int, now: datetime, cooldown: timedelta, stale: timedelta
) -> RecapClaim:
    free = or_(Story.recap_started_at.is_(None), Story.recap_started_at <= now - stale)
    cooled = or_(Story.recapped_at.is_(None), Story.recapped_at <= now - cooldown)
    claimed = await session.execute(
        update(Story).where(Story.id == story_id, free, cooled).values(recap_started_at=now, recapped_at=now)
    )
    if claimed.rowcount == 1:
        return RecapClaim(claimed=True)
    started, recapped = (
        await session.execute(select(Story.recap_started_at, Story.recapped_at).where(Story.id == story_id))
    ).one()
    if started is not None and started > now - stale:
        return RecapClaim(claimed=False, busy=True)
    return RecapClaim(claimed=False, again_at=recapped + cooldown if recapped is not None else now)


async def end_recap(session: AsyncSession, story_id: int, started: datetime) -> None:
    """The recap claimed at ``started`` is done (or failed): the next may be made once the cooldown has passed."""
    await session.execute(
        update(Story).where(Story.id == story_id, Story.recap_started_at == started).values(recap_started_at=None)
    )
