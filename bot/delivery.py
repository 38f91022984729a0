"""The delivery loop: one asyncio task that watches every job in flight and posts finished turns.

Each tick reads the jobs in flight from the database (so a restarted bot resumes them all),
asks the result store how each is doing, edits progress messages (rate-limited), and for a
finished turn: writes the clip, applies the result in one transaction (once per job id, in
``db.queries.apply_result``), then posts. Posting uses a Discord nonce derived from the job id,
so a bot killed between sending and recording the message id does not post twice when it
comes back: Discord returns the message it already made.

A broker or result store that goes away (a Redis restart) makes ticks fail; the loop backs off
and retries, and commands that need no queue keep working meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import discord
from pydantic import ValidationError

from bot.cards import GAUGE_FILENAME, render_gauges, state_embed
from bot.clips import ClipTooLarge, fit_to_size
from bot.queue import QueueUnavailable
from bot.turns import progress_text
from db.models import JobStatus
from db.queries import (
    JobInfo,
    apply_result,
    fail_job,
    get_job,
    jobs_in_flight,
    jobs_to_post,
    mark_job_running,
    set_job_messages,
    turn_of_job,
    update_job_progress,
)
from game.contract import RANDOM_WEIGHTS_LABEL, TOY_LABEL, TurnResult
from game.state import CharacterState, StateDeltas

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 30.0
UNDELIVERABLE = 0  # result_message_id for a turn whose channel is gone: never retried


class Delivery:
    def __init__(self, bot: AnimeGamerBot) -> None:
        self.bot = bot
        self._task: asyncio.Task[None] | None = None
        self._last_edit: dict[int, tuple[float, str]] = {}  # job id -> (when, text) of the last progress edit

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="animegamer-delivery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        poll = self.bot.settings.delivery_poll_seconds
        delay = poll
        while True:
            try:
                await self.tick()
                delay = poll
            except QueueUnavailable as exc:
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
                log.warning("queue unreachable (%s); retrying in %.0fs", exc, delay)
            except Exception:
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
                log.exception("delivery tick failed; retrying in %.0fs", delay)
            await asyncio.sleep(delay)

    async def tick(self) -> None:
        async with self.bot.sessions() as session:
            unposted = await jobs_to_post(session)
            in_flight = await jobs_in_flight(session)
        for job in unposted:
            await self.post(job)
        for job in in_flight:
            await self.advance(job)

    async def advance(self, job: JobInfo) -> None:
        task = await self.bot.queue.poll(job.task_id)
        if task.state in ("STARTED", "PROGRESS"):
            meta = task.info if isinstance(task.info, dict) else {}
            stage, step, total = meta.get("stage", ""), int(meta.get("step", 0)), int(meta.get("total", 0))
            async with self.bot.sessions() as session, session.begin():
                if stage == "denoise" and total:
                    await update_job_progress(session, job.id, step, total)
                elif job.status == "queued":
                    await mark_job_running(session, job.id)
            await self.show_progress(job, stage, step, total)
        elif task.state == "SUCCESS":
            await self.finish(job, task.info)
        elif task.state in ("FAILURE", "REVOKED"):
            reason = "it was cancelled" if task.state == "REVOKED" else _short(task.info)
            async with self.bot.sessions() as session, session.begin():
                failed = await fail_job(session, job.id, reason)
            if failed:
                await self._edit_progress(job, f"This turn could not be made: {reason}. Try again with /act.")
            await self.bot.queue.forget(job.task_id)

    async def finish(self, job: JobInfo, payload: object) -> None:
        try:
            result = TurnResult.model_validate(payload)
        except ValidationError as exc:
            async with self.bot.sessions() as session, session.begin():
                await fail_job(session, job.id, f"the worker's result was malformed ({exc.error_count()} errors)")
            return
        clip = self.clip_path(job)
        await asyncio.to_thread(_write_file, clip, result.mp4)
        async with self.bot.sessions() as session, session.begin():
            applied = await apply_result(session, job.id, result, str(clip))
        if not applied:  # cancelled or purged meanwhile, or another delivery got there first
            log.info("job %s finished but was not applied", job.id)
            async with self.bot.sessions() as session:
                now = await get_job(session, job.id)
            if now is None or now.status != JobStatus.DONE:
                await asyncio.to_thread(clip.unlink, missing_ok=True)  # nobody will ever post it
        await self.bot.queue.forget(job.task_id)
        self._last_edit.pop(job.id, None)
        if applied:
            async with self.bot.sessions() as session:
                posted = [j for j in await jobs_to_post(session) if j.id == job.id]
            for ready in posted:
                await self.post(ready)

    def clip_path(self, job: JobInfo) -> Path:
        return self.bot.settings.data_dir / "clips" / str(job.guild_id) / f"job_{job.id}.mp4"

    async def post(self, job: JobInfo) -> None:
        """Post a finished turn as a reply to its progress message; exactly once per job."""
        async with self.bot.sessions() as session:
            found = await turn_of_job(session, job.id)
        if found is None or job.channel_id is None:
            return
        _, turn, character = found
        assert turn.stamina_after is not None and turn.social_after is not None
        assert turn.entertainment_after is not None
        state = CharacterState(
            stamina=turn.stamina_after, social=turn.social_after, entertainment=turn.entertainment_after
        )
        deltas = StateDeltas(
            motion=turn.d_motion or 0,
            social=turn.d_social or 0,
            entertainment=turn.d_entertainment or 0,
            stamina=turn.d_stamina or 0,
        )
        label = {"tiny": RANDOM_WEIGHTS_LABEL, "toy": TOY_LABEL}.get(turn.model, "")
        files = [discord.File(io.BytesIO(await asyncio.to_thread(render_gauges, state, deltas)), GAUGE_FILENAME)]
        note = ""
        try:
            clip = await asyncio.to_thread(self._fitted_clip, turn.clip_path, job.guild_id)
            files.insert(0, discord.File(io.BytesIO(clip), f"turn_{job.id}.mp4"))
        except (OSError, ClipTooLarge) as exc:
            log.error("job %s: clip not attachable: %s", job.id, exc)
            note = "\n(The clip could not be attached; an admin can find it in the bot's logs.)"
        embed = state_embed(character.name, state, instruction=turn.instruction, deltas=deltas, label=label)

        from bot.cogs.play.views import result_view

        channel = self.bot.get_partial_messageable(job.channel_id, guild_id=job.guild_id)
        reference = None
        if job.progress_message_id:
            reference = discord.MessageReference(
                message_id=job.progress_message_id, channel_id=job.channel_id, fail_if_not_exists=False
            )
        try:
            message = await channel.send(
                content=f"<@{job.user_id}>{note}",
                embed=embed,
                files=files,
                view=result_view(job.id),
                reference=reference,
                allowed_mentions=discord.AllowedMentions(users=[discord.Object(job.user_id or 0)]),
                nonce=f"agjob{job.id}",  # Discord dedupes a repeat within minutes: posted once
            )
        except (discord.NotFound, discord.Forbidden) as exc:
            log.warning("job %s: channel %s refuses the post (%s); giving up", job.id, job.channel_id, exc)
            async with self.bot.sessions() as session, session.begin():
                await set_job_messages(session, job.id, result_message_id=UNDELIVERABLE)
            return
        async with self.bot.sessions() as session, session.begin():
            await set_job_messages(session, job.id, result_message_id=message.id)
        await self._edit_progress(job, f"🎬 {turn.instruction}\nDone: {message.jump_url}", force=True)

    def _fitted_clip(self, clip_path: str | None, guild_id: int | None) -> bytes:
        if not clip_path:
            raise OSError("no clip was recorded")
        data = Path(clip_path).read_bytes()
        guild = self.bot.get_guild(guild_id) if guild_id else None
        limit = guild.filesize_limit - 64 * 1024 if guild is not None else 10 * 1024 * 1024  # room for the PNG
        if self.bot.settings.upload_limit_bytes:
            limit = min(limit, self.bot.settings.upload_limit_bytes)
        return fit_to_size(data, limit)

    async def show_progress(self, job: JobInfo, stage: str, step: int, total: int) -> None:
        async with self.bot.sessions() as session:
            found = await turn_of_job(session, job.id)
        if found is not None:
            await self._edit_progress(job, progress_text(found[1].instruction, stage, step, total))

    async def _edit_progress(self, job: JobInfo, text: str, force: bool = False) -> None:
        """At most one edit per message every progress_edit_seconds, and none that changes nothing."""
        if not job.progress_message_id or not job.channel_id:
            return
        now = time.monotonic()
        last_time, last_text = self._last_edit.get(job.id, (0.0, ""))
        if text == last_text or (not force and now - last_time < self.bot.settings.progress_edit_seconds):
            return
        self._last_edit[job.id] = (now, text)
        channel = self.bot.get_partial_messageable(job.channel_id, guild_id=job.guild_id)
        try:
            await channel.get_partial_message(job.progress_message_id).edit(content=text)
        except discord.HTTPException as exc:
            log.info("job %s: progress message not edited (%s)", job.id, exc)


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_bytes(data)
    tmp.replace(path)


def _short(info: object) -> str:
    text = str(info) or type(info).__name__
    return text if len(text) <= 150 else text[:147] + "…"
