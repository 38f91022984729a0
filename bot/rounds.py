"""Vote rounds, once a second: show each changed round's message, close each round that is due, play its winner.

Each message the loop posts carries a Discord nonce of its own (the round's or the job's id): two bot processes
that both find a round without its message, or both announce a closed one before either records it, make one
message, which Discord hands to both. Closing is a guarded UPDATE, so one process makes the winner's turn.

Every state a round can be in has this loop as its owner: an open round's message is posted or edited here
(coalescing the votes of the last second into one edit, inside Discord's rate limits); a due round is closed
here, in the same transaction as its winner's turn, so the turn is made once however often the bot stops;
and a closed round whose result was never shown (the bot stopped in between) is shown on the next tick.
The winner's turn belongs to the channel, not to a player (its job has no user), so it never counts against
the proposer's own turn in flight or quota; the round's message says who proposed and who chose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import discord
from sqlalchemy import select

from bot.background import Background
from bot.cards import plain
from bot.errors import Refusal
from bot.making import make_turn
from bot.votes import round_text, round_view
from db.base import utcnow
from db.jobs import set_job_messages
from db.models import Job, JobKind, RoundStatus, StoryRound
from db.rounds import close_round, due_rounds, standing, unposted_rounds, voters_for
from game.instruction import unreadable

if TYPE_CHECKING:
    from bot.outbox import Outbox
    from db.engine import Sessions
    from relay.settings import Settings

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
MAX_SHOW_ATTEMPTS = 5  # a channel that refuses a round's result this often is given up on (logged)


class Rounds(Background):
    name = "animegamer-rounds"

    def __init__(
        self,
        settings: Settings,
        sessions: Sessions,
        outbox: Outbox,
        submitting: contextlib.AbstractAsyncContextManager[Any],
        discord_client: discord.Client,
    ) -> None:
        self.settings, self.sessions, self.outbox = settings, sessions, outbox
        self.submitting, self.discord = submitting, discord_client
        self._changed: set[int] = set()  # open rounds whose message is behind their proposals and votes
        self._failures: dict[int, int] = {}
        self._announcing = asyncio.Lock()  # /story close and the loop may close the same round at once: shown once

    def show(self, round_id: int) -> None:
        """Bring the round's message up to date on the next tick."""
        self._changed.add(round_id)

    async def _run(self) -> None:
        while True:
            self.began()
            try:
                await self.run_once()
                self.ticked()
            except Exception:
                log.exception("vote rounds: tick failed; trying again")
            finally:
                self.ended()
            await asyncio.sleep(TICK_SECONDS)

    async def run_once(self) -> None:
        async with self.sessions() as session:
            unposted = await unposted_rounds(session)
        changed, self._changed = self._changed | set(unposted), set()
        for round_id in sorted(changed):
            await self._refresh(round_id)
        async with self.sessions() as session:
            due = await due_rounds(session, utcnow())
        for round_id in due:
            await self.close(round_id)

    async def close(self, round_id: int) -> None:
        """Close the round if it is still open, making its winner's turn in the same transaction; then show it."""
        settings = self.settings
        async with self.submitting, self.sessions() as session, session.begin():
            closed = await close_round(session, round_id)
            chosen = closed.winner if closed is not None else None
            if chosen is not None and (why := unreadable(chosen.instruction)) is not None:
                # Proposed before a change this version does not read: the round still closes, and the next opens.
                log.warning("round %s: proposal %s cannot be read by this version (%s)", round_id, chosen.id, why)
                chosen = None
            if closed is not None and chosen is not None:
                story = closed.story
                try:
                    turn, _ = await make_turn(
                        session,
                        settings,
                        chosen.character_id,
                        chosen.instruction,
                        story=story,
                        kind=JobKind.STORY,
                        guild_id=story.guild_id,
                        channel_id=story.channel_id,
                        user_id=None,  # the channel's turn: see the module's docstring
                    )
                    closed.round.turn_id = turn.id
                except Refusal as refused:  # before any write: the round still closes, and the next opens
                    log.warning("round %s: proposal %s not played (%s)", round_id, chosen.id, refused)
                    chosen = None
        if closed is not None:
            played = f"proposal {chosen.id} played" if chosen is not None else "nothing to play"
            log.info("round %s closed: %s", round_id, played)
        async with self._announcing:
            job_id = await self._announce(round_id)
        if job_id is not None:
            await self.outbox.send_now(job_id)

    async def _refresh(self, round_id: int) -> None:
        async with self.sessions() as session:
            found = await standing(session, round_id)
        if found is None or found.round.status != RoundStatus.OPEN:
            return
        story = found.story
        channel = self.discord.get_partial_messageable(story.channel_id, guild_id=story.guild_id)
        text, view = round_text(found), round_view(found)
        try:
            if found.round.message_id:
                await channel.get_partial_message(found.round.message_id).edit(content=text, view=view)
                return
            message = await channel.send(text, view=view, nonce=f"aground{round_id}")
            if message.content != text:  # folded into another process's earlier send, which showed fewer proposals
                await message.edit(content=text, view=view)
        except discord.HTTPException as exc:
            log.warning("round %s: message not shown (%s); trying again", round_id, exc)
            self._changed.add(round_id)
            return
        async with self.sessions() as session, session.begin():
            row = await session.get(StoryRound, round_id)
            if row is not None:
                row.message_id = message.id

    async def _announce(self, round_id: int) -> int | None:
        """Show a closed round's result and its turn's progress message, once; the turn's job id, if any."""
        async with self.sessions() as session:
            found = await standing(session, round_id)
            if found is None or found.round.status != RoundStatus.CLOSED or found.round.announced:
                return None
            chosen = found.winner
            voters = await voters_for(session, chosen.id) if chosen is not None else []
            turn_id = found.round.turn_id
            job = await session.scalar(select(Job).where(Job.turn_id == turn_id)) if turn_id is not None else None
        story = found.story
        channel = self.discord.get_partial_messageable(story.channel_id, guild_id=story.guild_id)
        try:
            text = round_text(found, voters)
            if found.round.message_id:
                await channel.get_partial_message(found.round.message_id).edit(content=text, view=None)
            else:
                await channel.send(text, nonce=f"agroundend{round_id}")
            if job is not None and chosen is not None and job.progress_message_id is None:
                progress = await channel.send(
                    f"🎬 {plain(chosen.instruction, 200)}\nChosen by vote; queued.", nonce=f"agqueued{job.id}"
                )
                async with self.sessions() as session, session.begin():
                    await set_job_messages(session, job.id, progress_message_id=progress.id)
        except discord.HTTPException as exc:
            failures = self._failures[round_id] = self._failures.get(round_id, 0) + 1
            if failures < MAX_SHOW_ATTEMPTS:
                log.warning("round %s: result not shown (%s); trying again", round_id, exc)
                return job.id if job is not None else None
            log.error("round %s: result not shown after %d tries (%s); giving up", round_id, failures, exc)
        async with self.sessions() as session, session.begin():
            row = await session.get(StoryRound, round_id)
            if row is not None:
                row.announced = True
        self._failures.pop(round_id, None)
        return job.id if job is not None else None
