"""The queries behind clip reports and take-downs: players report posted clips, admins remove or dismiss them.

Like ``db.queries``: each takes the session first and never commits. A report, a removal and a dismissal are each
one guarded statement, so two admins, two clicks or two bot processes change a row once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from db import clip_copies, clip_deletes
from db.base import utcnow
from db.models import ClipReport, Job, Turn
from db.queries import insert_ignore

REMOVED, DISMISSED = "removed", "dismissed"


async def add_report(session: AsyncSession, guild_id: int, turn_id: int, reporter_id: int) -> bool:
    """Record a player's report of a turn's clip; False when they had reported it already."""
    return await insert_ignore(session, ClipReport, guild_id=guild_id, turn_id=turn_id, reporter_id=reporter_id)


@dataclass(frozen=True)
class ReportedClip:
    """A clip with open reports, as /admin reports lists it."""

    job_id: int
    user_id: int | None
    channel_id: int | None
    message_id: int | None
    instruction: str
    reports: int
    first: datetime


async def open_reports(session: AsyncSession, guild_id: int, limit: int = 15) -> list[ReportedClip]:
    """The server's clips with open reports, the most reported first."""
    count = func.count(ClipReport.id)
    rows = await session.execute(
        select(
            Job.id,
            Job.user_id,
            Job.channel_id,
            Job.result_message_id,
            Turn.instruction,
            count,
            func.min(ClipReport.created_at),
        )
        .join(Turn, Turn.id == ClipReport.turn_id)
        .join(Job, Job.turn_id == Turn.id)
        .where(ClipReport.guild_id == guild_id, ClipReport.resolved_at.is_(None))
        .group_by(Job.id, Job.user_id, Job.channel_id, Job.result_message_id, Turn.instruction)
        .order_by(count.desc(), Job.id)
        .limit(limit)
    )
    return [ReportedClip(*row) for row in rows]


async def resolve_reports(session: AsyncSession, turn_id: int, resolution: str, by: int) -> int:
    """Close a clip's open reports; returns how many were open."""
    result = await session.execute(
        update(ClipReport)
        .where(ClipReport.turn_id == turn_id, ClipReport.resolved_at.is_(None))
        .values(resolved_at=utcnow(), resolution=resolution, resolved_by=by)
    )
    return result.rowcount or 0


async def take_down(session: AsyncSession, turn_id: int) -> tuple[bool, list[str], int]:
    """Mark a turn's posted clip taken down, once. Returns whether this call did it, the keys whose deletion is
    recorded here for the caller to delete once this commits (the stored clip's first, then the kept recaps that
    hold it), and how many posted recaps and pages holding it were withdrawn with it (bot/clip_copies.py)."""
    key = (await session.execute(select(Turn.clip_key).where(Turn.id == turn_id))).scalar()
    done = await session.execute(
        update(Turn)
        .where(Turn.id == turn_id, Turn.clip_removed_at.is_(None))
        .values(clip_removed_at=utcnow(), clip_key=None)
    )
    if not done.rowcount:
        return False, [], 0
    if key:
        await clip_deletes.record(session, [key])
    copies, recaps = await clip_copies.withdraw(session, [turn_id])  # the recaps and pages holding it
    return True, ([key] if key else []) + recaps, copies
