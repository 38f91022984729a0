"""Retention, once an interval: old turns' clips and representations (``db.retention``), old blobs, the store's rows.

The settings are the bot's, not each server's: the disk and the database are the operator's, and
one policy across a hundred servers is what an operator can promise and size for. A server's
admins see it in /admin stats. The first sweep runs a minute after start, not during it.

A sweep is due once an interval for the whole fleet: each process looks every minute (or interval, if
shorter), and the one whose guarded write moves the due time forward sweeps (db/leases.claim_due). A process
killed in a sweep leaves the rest to the next one, an interval later.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import discord

from bot.background import Background
from bot.clip_copies import take_down_withdrawn
from bot.clip_deletes import retry_owed
from bot.clip_store import ClipStore
from bot.queue import TurnQueue
from db.engine import Sessions
from db.leases import claim_due, database_now
from db.retention import Swept, sweep
from game.history import MAX_WINDOW
from relay.blob_store import BlobStore
from relay.settings import Settings

log = logging.getLogger(__name__)

FIRST_SWEEP_SECONDS = 60.0
LOOK_SECONDS = 60.0  # how often each process asks whether a sweep is due
# Blobs only carry bytes across the queue; each is read within a turn's wait and run, or before the
# result store forgets its result (a day). Two days is above both.
BLOB_KEEP = timedelta(days=2)


def retention_text(settings: Settings) -> str:
    """The bot's retention as /admin stats shows it to a server's admins."""

    def kept(days: int) -> str:
        return "forever" if days == 0 else f"{days} day{'s' if days != 1 else ''}"

    return (
        f"Clips kept {kept(settings.clip_retention_days)}, prompt history data "
        f"{kept(settings.representation_retention_days)} (the bot's setting; each character's and story's "
        f"newest {MAX_WINDOW} turns keep both)"
    )


class Retention(Background):
    name = "animegamer-retention"

    def __init__(
        self,
        settings: Settings,
        sessions: Sessions,
        clips: ClipStore,
        blobs: BlobStore,
        queue: TurnQueue,
        process: str,
        discord_client: discord.Client,
    ) -> None:
        self.settings, self.sessions, self.clips, self.blobs, self.queue = settings, sessions, clips, blobs, queue
        self.process = process  # who claims a sweep
        self.discord = discord_client  # deletes the recaps and pages that held an expired or removed clip

    async def _run(self) -> None:
        interval = self.settings.retention_interval_seconds
        await asyncio.sleep(min(FIRST_SWEEP_SECONDS, interval))
        while True:
            try:
                if await self.due():
                    await self.run_once()
                await retry_owed(self.sessions, self.clips)  # deletions a store that was down still owes
                await take_down_withdrawn(self.discord, self.sessions)  # recaps and pages holding a removed clip
                self.ticked()
            except Exception:
                log.exception("retention sweep failed; trying again in an interval")
            await asyncio.sleep(min(LOOK_SECONDS, interval))

    async def due(self) -> bool:
        """Whether this process sweeps now: True for one process of the fleet once an interval."""
        async with self.sessions() as session, session.begin():
            now = await database_now(session)  # one clock for the fleet: a process's own may be off
            next_due = now + timedelta(seconds=self.settings.retention_interval_seconds)
            return await claim_due(session, "retention", self.process, next_due, now)

    async def run_once(self) -> Swept:
        settings = self.settings
        swept = await sweep(
            self.sessions,
            representation_days=settings.representation_retention_days,
            clip_days=settings.clip_retention_days,
            delete_clips=self.clips.delete,
        )
        try:
            await asyncio.to_thread(self.blobs.delete_older_than, BLOB_KEEP)
        except OSError as exc:  # a blob folder we cannot list or delete in: next sweep
            log.warning("retention: blob folder not cleaned (%s)", exc)
        try:
            purged = await self.queue.clean_store()
            log.info("retention: result store cleaned (%d expired claims and cancel marks)", purged)
        except Exception as exc:  # the store is down or busy: its rows wait for the next sweep
            log.warning("retention: result store not cleaned (%s)", exc)
        return swept
