"""Retention: old turns lose their clip file and their representation; each character's and story's newest keep both.

A turn's representation (868 KB at the published sizes) is read by one thing only: the history of
the next prompts, which carries the newest ``MAX_WINDOW - 1`` completed turns of the character (or
of the story) made by the same weights. So the newest ``MAX_WINDOW`` completed turns of every
character and of every story, per model key, keep theirs whatever their age; every other turn
older than the setting loses it (the column is set to NULL). Clips go the same way: the file is
deleted, ``clip_key`` becomes NULL and ``clip_expired_at`` says when, so /history can tell a
player the clip expired instead of pointing at nothing.

The work is index-driven and cut into batches, each its own short transaction (a SQLite write
holds the whole database): the partial indexes ``ix_turns_with_representation`` and
``ix_turns_with_clip`` hold exactly the turns that still have something to lose, oldest first.
Files are deleted after their batch commits: a crash in between leaves an orphan file, never a
row pointing at a deleted one.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from db import clip_copies, clip_deletes
from db.base import utcnow
from db.engine import Sessions
from db.models import Turn
from game.history import MAX_WINDOW

log = logging.getLogger(__name__)

BATCH = 500  # turns looked at per transaction


class Kept(enum.Enum):
    REPRESENTATIONS = "representations"
    CLIPS = "clips"

    @property
    def present(self) -> ColumnElement[bool]:
        """The partial index's WHERE, spelled the same so the planner uses it."""
        return Turn.representation.is_not(None) if self is Kept.REPRESENTATIONS else Turn.clip_key.is_not(None)


Cursor = tuple[datetime, int]  # (created_at, id) of the last turn a batch looked at


@dataclass
class Batch:
    looked_at: int
    pruned: list[int]
    files: list[str]  # keys of the clips to delete once the batch is committed
    cursor: Cursor | None  # where the next batch starts; None: nothing older is left to look at


def candidates(kind: Kept, before: datetime, after: Cursor | None = None, size: int = BATCH) -> Select[Any]:
    """The oldest turns made before ``before`` that still have ``kind``, from ``after`` on."""
    stmt = select(Turn.id, Turn.created_at, Turn.character_id, Turn.story_id, Turn.model_key, Turn.clip_key).where(
        kind.present, Turn.created_at < before
    )
    if after is not None:
        stmt = stmt.where(tuple_(Turn.created_at, Turn.id) > tuple_(*after))
    return stmt.order_by(Turn.created_at, Turn.id).limit(size)


def newest_of_character(character_id: int, model_key: str | None) -> Select[Any]:
    """The character's newest completed turns by these weights: the ones its next prompts may carry."""
    return (
        select(Turn.id)
        .where(Turn.character_id == character_id, _same_key(model_key), Turn.stamina_after.is_not(None))
        .order_by(Turn.id.desc())
        .limit(MAX_WINDOW)
    )


def newest_of_story(story_id: int, model_key: str | None) -> Select[Any]:
    """The story's newest completed turns by these weights: the ones its next prompts may carry."""
    return (
        select(Turn.id)
        .where(Turn.story_id == story_id, _same_key(model_key), Turn.stamina_after.is_not(None))
        .order_by(Turn.seq.desc())
        .limit(MAX_WINDOW)
    )


def _same_key(model_key: str | None) -> ColumnElement[bool]:
    return Turn.model_key.is_(None) if model_key is None else Turn.model_key == model_key


async def prune_batch(
    session: AsyncSession, kind: Kept, before: datetime, after: Cursor | None = None, size: int = BATCH
) -> Batch:
    """Take ``kind`` from one batch of old turns, sparing the newest of each character and story.

    The caller commits, then deletes ``files``.
    """
    rows = (await session.execute(candidates(kind, before, after, size))).all()
    kept: dict[tuple[str, int, str | None], set[int]] = {}

    async def newest(scope: str, owner: int, model_key: str | None) -> set[int]:
        key = (scope, owner, model_key)
        if key not in kept:
            stmt = newest_of_character(owner, model_key) if scope == "c" else newest_of_story(owner, model_key)
            kept[key] = set((await session.execute(stmt)).scalars())
        return kept[key]

    pruned: list[int] = []
    files: list[str] = []
    for row in rows:
        if row.character_id is not None and row.id in await newest("c", row.character_id, row.model_key):
            continue
        if row.story_id is not None and row.id in await newest("s", row.story_id, row.model_key):
            continue
        pruned.append(row.id)
        if kind is Kept.CLIPS and row.clip_key:
            files.append(row.clip_key)
    if pruned:
        values: dict[str, Any] = (
            {"representation": None}
            if kind is Kept.REPRESENTATIONS
            else {"clip_key": None, "clip_expired_at": utcnow()}
        )
        await session.execute(update(Turn).where(Turn.id.in_(pruned)).values(**values))
        await clip_deletes.record(session, files)  # owed until the store has deleted them (bot/clip_deletes.py)
        if kind is Kept.CLIPS:
            await clip_copies.withdraw(session, pruned)  # the recaps and pages that hold them go too
    cursor = (rows[-1].created_at, rows[-1].id) if len(rows) == size else None
    return Batch(looked_at=len(rows), pruned=pruned, files=files, cursor=cursor)


@dataclass
class Swept:
    representations: int = 0
    clips: int = 0
    files_missing: list[str] = field(default_factory=list)  # keys of clips whose file was already gone


async def sweep(
    sessions: Sessions,
    *,
    representation_days: int,
    clip_days: int,
    delete_clips: Callable[[list[str]], list[str]],
    now: datetime | None = None,
    size: int = BATCH,
) -> Swept:
    """Apply both retention settings to every old turn, batch by batch (0 days: keep forever).

    ``delete_clips`` deletes clips by key (the bot's clip store) and returns those already gone.
    """
    now = now or utcnow()
    swept = Swept()
    for kind, days in ((Kept.REPRESENTATIONS, representation_days), (Kept.CLIPS, clip_days)):
        if days <= 0:
            continue
        before = now - timedelta(days=days)
        cursor: Cursor | None = None
        while True:
            async with sessions() as session, session.begin():
                batch = await prune_batch(session, kind, before, cursor, size)
            if kind is Kept.REPRESENTATIONS:
                swept.representations += len(batch.pruned)
            else:
                swept.clips += len(batch.pruned)
                swept.files_missing += await asyncio.to_thread(delete_clips, batch.files)
            if batch.cursor is None:
                break
            cursor = batch.cursor
    if swept.representations or swept.clips:
        log.info("retention: %d representations and %d clips of old turns deleted", swept.representations, swept.clips)
    return swept
