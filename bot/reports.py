"""Taking a posted clip down: the Discord message and the stored clip go, the turn's text and state stay.

One action for an admin's ``/admin reports remove`` and a player's Delete button under their own turn. The message
is deleted first (a failure there changes nothing, so the command can simply be tried again), then the turn is
marked in one guarded statement with its reports closed and an audit row, then the stored clip file is deleted, and
the posted recaps and story pages that hold the clip with it (bot/clip_copies.py).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import discord

from bot.clip_copies import take_down_withdrawn
from bot.clip_deletes import delete_owed
from db import moderation, reports
from db.models import Job, Turn

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

log = logging.getLogger(__name__)


PENDING = " (The stored clip is deleted as soon as the clip store answers again.)"


@dataclass(frozen=True)
class TakenDown:
    stored_gone: bool  # False: the stored clip's deletion is recorded, and done once the store answers again
    copies: int  # posted recaps and story pages that held the clip, withdrawn with it
    copies_left: int = 0  # of those, the messages Discord did not delete now: the retention loop tries again

    def said(self) -> str:
        """What the answer adds to "the clip is deleted": never a message deleted that is still up."""
        text = ""
        if self.copies and not self.copies_left:
            text += f" {self.copies} recap or story page message(s) that held it are deleted too."
        elif self.copies:
            text += (
                f" {self.copies} recap or story page message(s) held it: {self.copies - self.copies_left} deleted, "
                f"{self.copies_left} on a later try (Discord refused it now)."
            )
        return text + ("" if self.stored_gone else PENDING)


async def take_down_clip(bot: AnimeGamerBot, job: Job, turn: Turn, *, actor_id: int, action: str) -> TakenDown | None:
    """Delete the turn's posted message, its stored clip and the recaps and story pages posted with it. None when it
    was taken down already."""
    if turn.clip_removed_at is not None:
        return None
    if job.channel_id and job.result_message_id:  # 0: never posted (undeliverable)
        channel = bot.get_partial_messageable(job.channel_id, guild_id=job.guild_id)
        with contextlib.suppress(discord.NotFound):  # deleted in Discord already: the rest still has to happen
            await channel.get_partial_message(job.result_message_id).delete()
    async with bot.sessions() as session, session.begin():
        taken, keys, copies = await reports.take_down(session, turn.id)
        if not taken:
            return None
        closed = await reports.resolve_reports(session, turn.id, reports.REMOVED, actor_id)
        if job.guild_id is not None:
            details = f"{closed} open report(s); {turn.instruction}"[:500]
            await moderation.audit(session, job.guild_id, actor_id, action, f"job {job.id}", details)
    owed = await delete_owed(bot.sessions, bot.clips, keys)  # recorded with the take-down
    # What Discord refuses now, the retention loop retries each minute.
    left = await take_down_withdrawn(bot, bot.sessions) if copies else 0
    log.info("job %s: clip taken down (%s by %s), %d copies withdrawn", job.id, action, actor_id, copies)
    return TakenDown(stored_gone=not owed, copies=copies, copies_left=min(left, copies))
