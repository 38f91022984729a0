"""Deleting stored clips and recaps so that the deletion outlives an outage of the store.

A caller records the keys (``db.clip_deletes.record``) in the transaction that clears them from their rows, then
calls ``delete_owed``: what the store deleted, or found gone, is no longer owed; what it could not delete stays
owed, and every bot process's retention loop tries it again each minute (``retry_owed``) until the store answers.
So no object outlives its row for longer than the store is down, and an answer can say what is still to go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from bot.clip_store import ClipStore
from db import clip_deletes
from db.engine import Sessions

log = logging.getLogger(__name__)


def _delete_now(store: ClipStore, keys: Sequence[str]) -> list[str]:
    """Delete ``keys`` (each ``prefix*`` the keys under it now); returns those the store could not delete."""
    exact = [key for key in keys if not key.endswith(clip_deletes.EVERY)]
    failed = []
    for every in (key for key in keys if key.endswith(clip_deletes.EVERY)):
        try:
            under = store.keys(every.removesuffix(clip_deletes.EVERY))
        except OSError:
            failed.append(every)
            continue
        _, left = store.delete_now(under)
        failed += [every] if left else []
    return failed + store.delete_now(exact)[1]


async def owe(sessions: Sessions, store: ClipStore, keys: Sequence[str]) -> list[str]:
    """Record the deletion of ``keys``, whose rows stay (a story's kept recaps), then delete them: ``delete_owed``."""
    async with sessions() as session, session.begin():
        await clip_deletes.record(session, keys)
    return await delete_owed(sessions, store, keys)


async def delete_owed(sessions: Sessions, store: ClipStore, keys: Sequence[str]) -> list[str]:
    """Delete ``keys``, whose deletion is recorded; returns those the store could not delete now (still owed)."""
    if not keys:
        return []
    failed = await asyncio.to_thread(_delete_now, store, keys)
    async with sessions() as session, session.begin():
        await clip_deletes.done(session, set(keys) - set(failed))
        await clip_deletes.tried(session, failed)
    if failed:
        log.warning("%d stored clip(s) not deleted now; each is tried again every minute until it is", len(failed))
    return failed


async def retry_owed(sessions: Sessions, store: ClipStore) -> int:
    """Try every owed deletion again; returns how many are still owed."""
    async with sessions() as session:
        keys = await clip_deletes.owed(session)
    if not keys:
        return 0
    failed = await delete_owed(sessions, store, keys)
    if len(keys) > len(failed):
        log.info("%d owed clip deletion(s) done", len(keys) - len(failed))
    async with sessions() as session:
        return await clip_deletes.count(session)
