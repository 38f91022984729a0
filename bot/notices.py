"""Telling a player how their turn goes: the progress message, and where else to reach them when it cannot.

The progress message is the public reply a turn gets when it is queued; it is edited as the
turn moves (at most once every ``progress_edit_seconds``, and never with the same text). When
something has to reach the player and that message is gone (or the channel refuses the bot),
the notice goes, in order, to: an ephemeral followup on the interaction that queued the turn
(while its 15-minute token lives), a direct message (if the player accepts them), and the
server's audit log (``/admin audit``), so it is never lost silently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import discord

from db import moderation
from db.jobs import JobInfo

if TYPE_CHECKING:
    from db.engine import Sessions
    from relay.settings import Settings

log = logging.getLogger(__name__)

TOKEN_LIFETIME_SECONDS = 14 * 60.0  # Discord's interaction tokens live 15 minutes; keep a margin


class Notices:
    def __init__(self, settings: Settings, sessions: Sessions, discord_client: discord.Client) -> None:
        self.settings, self.sessions, self.discord = settings, sessions, discord_client
        self._last_edit: dict[int, tuple[float, str]] = {}  # job id -> (when, text) of its last progress edit
        self._interactions: dict[int, tuple[float, discord.Interaction]] = {}  # job id -> (when, the /act)

    def remember(self, job_id: int, interaction: discord.Interaction) -> None:
        """Keep the interaction that queued a job while its token can still send followups."""
        now = time.monotonic()
        self._interactions = {k: v for k, v in self._interactions.items() if now - v[0] < TOKEN_LIFETIME_SECONDS}
        self._interactions[job_id] = (now, interaction)

    def forget(self, job_id: int) -> None:
        self._last_edit.pop(job_id, None)
        self._interactions.pop(job_id, None)

    def keep_only(self, job_ids: set[int], seen_at: float) -> None:
        """Drop what is kept for jobs that ended and were posted (or never will be).

        ``job_ids`` were read at ``seen_at`` (time.monotonic()); a job submitted since is not among them
        yet, so entries newer than that stay.
        """
        self._last_edit = {k: v for k, v in self._last_edit.items() if k in job_ids or v[0] >= seen_at}
        self._interactions = {k: v for k, v in self._interactions.items() if k in job_ids or v[0] >= seen_at}

    async def edit_progress(
        self,
        job: JobInfo,
        text: str,
        force: bool = False,
        current: Callable[[], Awaitable[bool]] | None = None,
    ) -> bool:
        """Edit the job's progress message; False if it has none or the edit failed. ``current`` is asked just
        before an edit that is due: False (what the text shows is no longer so) and nothing is edited."""
        if not job.progress_message_id or not job.channel_id:
            return False
        now = time.monotonic()
        last_time, last_text = self._last_edit.get(job.id, (0.0, ""))
        if text == last_text:
            return True
        if not force and now - last_time < self.settings.progress_edit_seconds:
            return True
        if current is not None and not await current():
            return False
        self._last_edit[job.id] = (now, text)
        channel = self.discord.get_partial_messageable(job.channel_id, guild_id=job.guild_id)
        try:
            await channel.get_partial_message(job.progress_message_id).edit(content=text)
        except (discord.HTTPException, OSError) as exc:
            log.info("job %s: progress message not edited (%s)", job.id, exc)
            return False
        return True

    async def tell(self, job: JobInfo, text: str) -> None:
        """Say how a turn ended: in its progress message, else wherever the player can still be reached."""
        if await self.edit_progress(job, f"🎬 {job.instruction}\n{text}", force=True):
            self.forget(job.id)
            return
        await self.reach(job, text)
        self.forget(job.id)

    async def reach(self, job: JobInfo, text: str) -> str:
        """Reach the player privately: followup, DM, or the audit log. Returns where it went."""
        held = self._interactions.get(job.id)
        if held is not None and time.monotonic() - held[0] < TOKEN_LIFETIME_SECONDS:
            try:
                await held[1].followup.send(text, ephemeral=True)
                return "followup"
            except (discord.HTTPException, OSError) as exc:
                log.info("job %s: followup refused (%s)", job.id, exc)
        if job.user_id:
            try:
                user = self.discord.get_user(job.user_id) or await self.discord.fetch_user(job.user_id)
                await user.send(text)
                return "dm"
            except (discord.HTTPException, OSError) as exc:
                log.info("job %s: DM refused (%s)", job.id, exc)
        if job.guild_id is not None:
            async with self.sessions() as session, session.begin():
                await moderation.audit(
                    session,
                    job.guild_id,
                    0,
                    "player not reached",
                    str(job.user_id or ""),
                    f"job {job.id}: {text}"[:500],
                )
        log.warning("job %s: player %s not reached; noted in the audit log", job.id, job.user_id)
        return "audit"
