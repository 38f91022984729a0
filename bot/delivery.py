"""Posting finished turns: each job on its own task, a few at once, each story's posts in order.

A finished turn (its result applied by the supervisor) is posted as a normal channel message
replying to its progress message, so posting does not depend on the 15-minute interaction
token. The post carries a Discord nonce derived from the job id, so a bot killed between
posting and recording the message id does not post twice when it comes back: Discord returns
the message it already made.

Failures stay with their job:

- transient ones (a 5xx that outlived discord.py's own retries, a 429, the network, a full
  disk) are retried with exponential backoff and jitter, up to ``MAX_POST_ATTEMPTS`` (counted
  in the database, so a restart does not reset them);
- permanent ones (the channel is gone, the bot may not post there, the thread is archived or
  locked, the message is refused as too large) end the post at once;

and either way, a post that will never happen is marked undeliverable and the player is told
where their turn went (``Notices.reach``). No failure holds up another job; a story's turn
waits only for the turns of the same story before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import random
import time
from typing import TYPE_CHECKING

import discord

from bot.cards import GAUGE_FILENAME, render_gauges, state_embed
from bot.clip_deletes import delete_owed
from bot.clip_store import StoreUnavailable
from bot.safety import ClipRules
from db import moderation
from db.jobs import (
    JobInfo,
    earlier_story_turns_unposted,
    jobs_to_post,
    mark_undeliverable,
    note_post_failure,
    record_post,
    turn_of_job,
    turn_outcome,
    withhold_clip,
)
from media.clips import ClipTooLarge, fit_to_size

if TYPE_CHECKING:
    from bot.clip_store import ClipStore
    from bot.leases import PostingShards
    from bot.metrics import BotMetrics
    from bot.notices import Notices
    from db.engine import Sessions
    from relay.settings import Settings

log = logging.getLogger(__name__)

UNDELIVERABLE = 0  # result_message_id of a turn that will never be posted
MAX_POST_ATTEMPTS = 8  # transient failures before a post is given up (about 10 minutes of backoff)
BACKOFF_BASE_SECONDS, BACKOFF_MAX_SECONDS = 2.0, 300.0
# Discord error codes that no retry can fix: unknown channel / message, missing access or
# permissions, cannot message the user, thread archived or locked, request too large.
PERMANENT_CODES = frozenset({10003, 10008, 50001, 50013, 50007, 50083, 160005, 40005, 50035})


class PostRefused(Exception):
    """The channel will never take this post; the message says why, for the player."""


def is_permanent(exc: BaseException) -> bool:
    if isinstance(exc, discord.Forbidden | discord.NotFound | PostRefused):
        return True
    if isinstance(exc, discord.HTTPException):
        return exc.code in PERMANENT_CODES or (400 <= exc.status < 500 and exc.status not in (408, 429))
    return False


def backoff_seconds(failures: int) -> float:
    """Exponential, with jitter so that many failed posts do not all come back at the same instant."""
    return random.uniform(0.5, 1.0) * min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (failures - 1))


class Delivery:
    def __init__(
        self,
        settings: Settings,
        sessions: Sessions,
        clips: ClipStore,
        metrics: BotMetrics,
        notices: Notices,
        posting: PostingShards,
        discord_client: discord.Client,
    ) -> None:
        self.settings, self.sessions, self.clips, self.metrics = settings, sessions, clips, metrics
        self.notices, self.posting, self.discord = notices, posting, discord_client
        self._posting: dict[int, asyncio.Task[None]] = {}
        self._retry_at: dict[int, float] = {}  # job id -> monotonic time of its next attempt
        self._store_tries: dict[int, int] = {}  # job id -> posts in a row the clip store did not answer
        self._slots = asyncio.Semaphore(settings.delivery_concurrency)

    def start(self) -> None:
        # Which shards' turns this process posts: leases renewed on their own schedule (bot/leases.py).
        self.posting.start()

    async def post_pending(self) -> set[int]:
        """Start a task for every finished turn this process posts (its guild's shard is this process's to post)
        not yet posted (nor being posted, nor waiting to retry).

        Returns the ids of every turn still to be posted, by this process or another.
        """
        async with self.sessions() as session:
            jobs = await jobs_to_post(session)
        now = time.monotonic()
        for job in jobs:
            if job.id in self._posting or now < self._retry_at.get(job.id, 0.0) or not self.posting.posts(job.guild_id):
                continue
            self._posting[job.id] = asyncio.create_task(self._deliver(job), name=f"animegamer-post-{job.id}")
        return {job.id for job in jobs}

    async def stop(self) -> None:
        await self.posting.stop()
        tasks = list(self._posting.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._posting.clear()
        await self.posting.give_up()  # a clean stop: another process posts these shards' turns at its next renewal

    async def _deliver(self, job: JobInfo) -> None:
        try:
            if job.story_id is not None and job.seq is not None:
                async with self.sessions() as session:
                    if await earlier_story_turns_unposted(session, job.story_id, job.seq):
                        return  # the story's earlier turn goes first; the next tick tries this one again
            async with self._slots:
                await self.post(job)
            self._retry_at.pop(job.id, None)
            self._store_tries.pop(job.id, None)
        except Exception as exc:
            await self._failed(job, exc)
        finally:
            self._posting.pop(job.id, None)

    async def _failed(self, job: JobInfo, exc: Exception) -> None:
        if isinstance(exc, StoreUnavailable):
            await self._store_down(job, exc)
            return
        if is_permanent(exc):
            log.warning("job %s: channel %s refuses the post for good (%s)", job.id, job.channel_id, exc)
            await self.give_up(job, _why(exc))
            return
        async with self.sessions() as session, session.begin():
            failures = await note_post_failure(session, job.id)
        if failures >= MAX_POST_ATTEMPTS:
            log.error("job %s: post failed %d times (%r); giving up", job.id, failures, exc)
            await self.give_up(job, "Discord kept failing")
            return
        delay = backoff_seconds(failures)
        self._retry_at[job.id] = time.monotonic() + delay
        self.metrics.delivery_retries.inc()
        log.warning("job %s: post failed (%r); attempt %d again in %.1fs", job.id, exc, failures + 1, delay)

    async def _store_down(self, job: JobInfo, exc: StoreUnavailable) -> None:
        """The clip store does not answer: the post waits, backing off, for as long as it takes. This is not
        Discord failing, so it spends none of the post's attempts; the player hears once that the turn is late."""
        tries = self._store_tries[job.id] = self._store_tries.get(job.id, 0) + 1
        delay = backoff_seconds(tries)
        self._retry_at[job.id] = time.monotonic() + delay
        log.warning("job %s: its clip cannot be read (%s); posting again in %.1fs", job.id, exc, delay)
        if tries == 1:
            late = "Made, but late: the bot cannot read the clip right now. It will be posted soon."
            await self.notices.edit_progress(job, f"🎬 {job.instruction}\n{late}", force=True)

    async def give_up(self, job: JobInfo, why: str) -> None:
        """Tell the player where their turn is, then mark the post undeliverable (never tried again)."""
        where = f"<#{job.channel_id}>" if job.channel_id else "the channel"
        await self.notices.reach(
            job,
            f"Your turn `{job.instruction}` is done, but I could not post it in {where} ({why}). "
            "Your character was updated: /status shows it.",
        )
        async with self.sessions() as session, session.begin():
            given_up = await mark_undeliverable(session, job.id, UNDELIVERABLE)
        self._retry_at.pop(job.id, None)
        if given_up:
            self.metrics.undeliverable.inc()

    async def post(self, job: JobInfo) -> None:
        """Post a finished turn as a reply to its progress message; exactly once per job."""
        async with self.sessions() as session:
            found = await turn_of_job(session, job.id)
        if found is None or job.channel_id is None:
            return
        row, turn, character = found
        if row.result_message_id is not None:
            # Posted since ``job`` was read: a tick's reading of the turns to post may predate the commit of this
            # process's own post, whose task had ended by the time the tick looked for it.
            return
        state, deltas = turn_outcome(turn)
        label = turn.label or ""  # the worker's word on its model, not the bot's setting
        files = [discord.File(io.BytesIO(await asyncio.to_thread(render_gauges, state, deltas)), GAUGE_FILENAME)]
        note = ""
        verdict = (await ClipRules.of(self.settings, self.sessions, self.discord, job.guild_id, job.channel_id)).judge(
            turn.safety
        )
        if not verdict.post:  # never read, never uploaded
            note = "\n(This turn's clip was withheld by the server's safety setting.)"
        else:
            try:
                clip = await asyncio.to_thread(self._fitted_clip, turn.clip_key, job.guild_id)
                files.insert(0, discord.File(io.BytesIO(clip), f"turn_{job.id}.mp4"))
            except StoreUnavailable:
                raise  # the clip store is down: the post waits and is tried again, never sent without its clip
            except (OSError, ClipTooLarge) as exc:
                log.error("job %s: clip not attachable: %s", job.id, exc)
                note = "\n(The clip could not be attached: it is missing or too large even after re-encoding.)"
        name = character.name if character is not None else "A former player"
        embed = state_embed(name, state, instruction=turn.instruction, deltas=deltas, label=label)

        from bot.buttons import result_view

        channel = self.discord.get_partial_messageable(job.channel_id, guild_id=job.guild_id)
        reference = None
        if job.progress_message_id:
            reference = discord.MessageReference(
                message_id=job.progress_message_id, channel_id=job.channel_id, fail_if_not_exists=False
            )
        if not self.posting.posts(job.guild_id):  # asked at the last moment: a post may wait long for its slot
            log.info("job %s: its shard's posts are no longer this process's; its poster posts it", job.id)
            return
        message = await channel.send(
            content=f"<@{job.user_id}>{note}",
            embed=embed,
            files=files,
            view=result_view(job.id, clip=len(files) > 1),  # the gauges, and the clip when it is attached
            reference=reference,
            allowed_mentions=discord.AllowedMentions(users=[discord.Object(job.user_id or 0)]),
            nonce=f"agjob{job.id}",  # Discord dedupes a repeat within minutes: posted once
        )
        async with self.sessions() as session, session.begin():
            first = await record_post(session, job.id, message.id)
            if first and verdict.flagged and job.guild_id is not None:  # every decision on a flagged clip, once
                action = "clip posted (flagged)" if verdict.post else "clip withheld"
                await moderation.audit(session, job.guild_id, 0, action, f"job {job.id}", verdict.why[:500])
            if first and not verdict.post:
                await withhold_clip(session, turn.id, verdict.why)
        if not first:
            log.info("job %s was recorded as posted by another process (message %s)", job.id, message.id)
            return
        log.info("job %s posted as message %s", job.id, message.id)
        if verdict.flagged:
            done = "flagged clip posted" if verdict.post else "clip withheld"
            log.warning("job %s: %s: %s", job.id, done, verdict.why)
            decision = "posted_flagged" if verdict.post else f"withheld_{'flagged' if verdict.checked else 'unchecked'}"
            self.metrics.clip_safety.labels(decision).inc()
        if not verdict.post:
            if turn.clip_key:  # its deletion recorded as it was withheld
                await delete_owed(self.sessions, self.clips, [turn.clip_key])
            await self.notices.reach(
                job,
                f"The clip of your turn `{job.instruction}` was not posted: {verdict.why}. "
                "The turn still counts: your character was updated and the story goes on.",
            )
        notices = self.notices
        await notices.edit_progress(job, f"🎬 {turn.instruction}\nDone: {message.jump_url}", force=True)
        notices.forget(job.id)

    def _fitted_clip(self, clip_key: str | None, guild_id: int | None) -> bytes:
        if not clip_key:
            raise OSError("no clip was recorded")
        data = self.clips.get(clip_key)
        guild = self.discord.get_guild(guild_id) if guild_id else None
        limit = guild.filesize_limit - 64 * 1024 if guild is not None else 10 * 1024 * 1024  # room for the PNG
        if self.settings.upload_limit_bytes:
            limit = min(limit, self.settings.upload_limit_bytes)
        return fit_to_size(data, limit)


def _why(exc: BaseException) -> str:
    """The cause of a refused post in a few words a player understands."""
    code = getattr(exc, "code", None)
    if isinstance(exc, discord.NotFound) or code in (10003, 10008):
        return "the channel is gone"
    if code in (50083, 160005):
        return "the thread is archived or locked"
    if isinstance(exc, discord.Forbidden) or code in (50001, 50013):
        return "I am not allowed to post there"
    if code == 40005:
        return "the clip is too large"
    return "Discord refused the post"
