"""Shared story channels: several players, one world, one history."""

from __future__ import annotations

import asyncio
import io
import logging
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import av
import discord
from discord import app_commands
from discord.ext import commands
from sqlalchemy.exc import IntegrityError

from bot.clip_copies import take_down_withdrawn
from bot.clip_deletes import owe
from bot.cogs.story.page import story_page
from bot.errors import Refusal, defer_privately, defer_publicly, fill
from bot.recaps import RECAP_STALE, every_recap, recap_file, recap_key
from bot.safety import ClipRules
from bot.turn_options import Background, Line, Motion, turn_options
from bot.turns import TurnInput, check_may_play, check_turn, submit_turn
from db import clip_copies
from db.base import utcnow
from db.clip_copies import PAGE, RECAP
from db.models import JobKind, Story, StoryProposal, Turn, TurnOrder
from db.queries import (
    active_character,
    active_story,
    create_story,
    end_story,
    join_story,
    leave_story,
    story_turns,
)
from db.recaps import claim_recap, end_recap
from db.rounds import close_now, proposals_in, round_for_proposal
from game.text import clean_text
from game.votes import DEFAULT_ROUND_MINUTES, MAX_PROPOSALS, MAX_ROUND_MINUTES, MIN_ROUND_MINUTES
from media.clips import ClipTooLarge

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

log = logging.getLogger(__name__)


@app_commands.guild_only()
class Stories(commands.GroupCog, group_name="story", group_description="Shared story channels"):
    def __init__(self, bot: AnimeGamerBot) -> None:
        self.bot = bot

    async def _story(self, interaction: discord.Interaction) -> Story:
        async with self.bot.sessions() as session:
            story = await active_story(session, interaction.channel_id)
        if story is None:
            raise Refusal("This channel has no story; start one with /story start.")
        return story

    @app_commands.command(name="start", description="Make this channel a shared story")
    @app_commands.describe(
        title="the story's title",
        order="free for all, players in turn, or the channel proposes and votes",
        round_minutes="vote order: how long each round stays open after its first proposal",
    )
    async def start(
        self,
        interaction: discord.Interaction,
        title: app_commands.Range[str, 1, 100],
        order: Literal["free", "round_robin", "vote"] = "free",
        round_minutes: app_commands.Range[int, MIN_ROUND_MINUTES, MAX_ROUND_MINUTES] = DEFAULT_ROUND_MINUTES,
    ) -> None:
        title = clean_text(title, label="The title", max_chars=100)
        await defer_publicly(interaction)
        try:
            async with self.bot.sessions() as session, session.begin():
                await check_may_play(session, interaction.guild_id, interaction.channel_id, interaction.user.id)
                story = await create_story(
                    session, interaction.guild_id, interaction.channel_id, title, interaction.user.id, TurnOrder(order)
                )
                if story.turn_order == TurnOrder.VOTE:
                    story.round_seconds = 60 * round_minutes
        except IntegrityError as exc:
            raise Refusal("This channel already has a story; /story end it first.") from exc
        how = (
            f"Propose the next turn with /story propose; the channel votes, {round_minutes} min a round."
            if order == "vote"
            else "Join with /story join, play with /story act."
        )
        await fill(
            interaction, f"📖 **{discord.utils.escape_markdown(title)}** begins here ({order.replace('_', ' ')}). {how}"
        )

    @app_commands.command(name="join", description="Bring your character into this channel's story")
    async def join(self, interaction: discord.Interaction) -> None:
        story = await self._story(interaction)
        await defer_publicly(interaction)
        async with self.bot.sessions() as session, session.begin():
            character = await active_character(session, interaction.guild_id, interaction.user.id)
            if character is None:
                raise Refusal("Pick your character first with /start.")
            await join_story(session, story, character)
            name = character.name
        await fill(interaction, f"{discord.utils.escape_markdown(name)} joins the story.")

    @app_commands.command(name="leave", description="Take your character out of this channel's story")
    async def leave(self, interaction: discord.Interaction) -> None:
        story = await self._story(interaction)
        await defer_privately(interaction)
        async with self.bot.sessions() as session, session.begin():
            character = await active_character(session, interaction.guild_id, interaction.user.id)
            left = character is not None and await leave_story(session, story.id, character.id)
        if not left:
            raise Refusal("Your character is not in this story.")
        await fill(interaction, "You left the story.", ephemeral=True)

    @turn_options
    @app_commands.command(name="act", description="Take the story's next turn")
    async def act(
        self,
        interaction: discord.Interaction,
        motion: Motion | None = None,
        background: Background | None = None,
        time: str | None = None,
        instruction: Line | None = None,
    ) -> None:
        story = await self._story(interaction)
        if story.turn_order == TurnOrder.VOTE:
            raise Refusal("This story is steered by vote: propose the next turn with /story propose.")
        typed = TurnInput(instruction=instruction, motion=motion, background=background, time=time)
        await submit_turn(self.bot, interaction, typed, story=story, kind=JobKind.STORY)

    @turn_options
    @app_commands.command(name="propose", description="Propose the story's next turn; the channel votes")
    async def propose(
        self,
        interaction: discord.Interaction,
        motion: Motion | None = None,
        background: Background | None = None,
        time: str | None = None,
        instruction: Line | None = None,
    ) -> None:
        story = await self._story(interaction)
        if story.turn_order != TurnOrder.VOTE:
            raise Refusal("This story is not steered by vote; play with /story act.")
        typed = TurnInput(instruction=instruction, motion=motion, background=background, time=time)
        await defer_privately(interaction)
        guild_id, user_id = interaction.guild_id, interaction.user.id
        async with self.bot.sessions() as session:  # the checks /act makes, before anyone sees it
            checked = await check_turn(self.bot, session, guild_id, interaction.channel_id, user_id, typed)
        character, line = checked.character, checked.instruction
        try:
            async with self.bot.submitting, self.bot.sessions() as session, session.begin():
                found, _ = await round_for_proposal(session, story, utcnow())
                if await proposals_in(session, found.id) >= MAX_PROPOSALS:
                    raise Refusal(f"This round has {MAX_PROPOSALS} proposals already; vote for one of them.")
                session.add(
                    StoryProposal(round_id=found.id, user_id=user_id, character_id=character.id, instruction=str(line))
                )
                await session.flush()
                round_id, number = found.id, found.number
        except IntegrityError as exc:
            raise Refusal("You already proposed in this round; vote, or propose in the next one.") from exc
        self.bot.rounds.show(round_id)
        await fill(interaction, f"Proposed for round {number}: `{line}`. The channel votes on it here.", ephemeral=True)

    @app_commands.command(name="close", description="Close this story's vote round now and play its winner")
    async def close(self, interaction: discord.Interaction) -> None:
        story = await self._story(interaction)
        if story.created_by != interaction.user.id and not interaction.permissions.manage_guild:
            raise Refusal("Only the story's creator or a server manager can close a round early.")
        await defer_privately(interaction)
        async with self.bot.sessions() as session, session.begin():
            found = await close_now(session, story.id, utcnow())
        if found is None:
            raise Refusal("This story has no open round.")
        await self.bot.rounds.close(found.id)
        await fill(interaction, f"Round {found.number} is closed; its winner is being played.", ephemeral=True)

    async def _claim_recap(self, story_id: int) -> datetime:
        """One recap per story per cooldown, in the whole fleet: a long story's first recap is a minute of CPU.
        Returns the claim's time, which ends it."""
        now = utcnow()
        cooldown = timedelta(seconds=self.bot.settings.recap_cooldown_seconds)
        async with self.bot.sessions() as session, session.begin():
            claim = await claim_recap(session, story_id, now, cooldown, RECAP_STALE)
        if claim.busy:
            raise Refusal("This story's recap is being made; it will appear here shortly.")
        if not claim.claimed:
            again = int(claim.again_at.timestamp()) + 1 if claim.again_at else int(now.timestamp())
            raise Refusal(f"This story had a recap just now; ask again <t:{again}:R>.")
        return now

    @app_commands.command(name="recap", description="The story so far: one clip and a summary")
    async def recap(self, interaction: discord.Interaction) -> None:
        story = await self._story(interaction)
        async with self.bot.sessions() as session:
            turns = await story_turns(session, story.id)
        if not turns:
            raise Refusal("Nothing has happened in this story yet.")
        started = await self._claim_recap(story.id)
        with tempfile.TemporaryDirectory(prefix="animegamer-recap-") as work:
            try:
                await interaction.response.defer(thinking=True)
                limit = self._upload_limit(interaction)
                files, note, held = await self._recap_clip(
                    story.id, turns, limit, interaction.guild_id, interaction.channel_id, Path(work)
                )
            finally:
                async with self.bot.sessions() as session, session.begin():
                    await end_recap(session, story.id, started)
            summary = "\n".join(
                f"{turn.seq}. {discord.utils.escape_markdown(turn.instruction)} ({discord.utils.escape_markdown(name)})"
                for turn, name in turns
            )
            header = f"📖 **{discord.utils.escape_markdown(story.title)}** so far ({len(turns)} turns):\n"
            message = await fill(interaction, (header + summary)[: 2000 - len(note)] + note, files=files)
        if held:
            await self._posted_copy(RECAP, story.id, message, held, recap_key(self.bot.clips, story.id, held, limit))

    async def _recap_clip(
        self,
        story_id: int,
        turns: list[tuple[Turn, str]],
        limit: int,
        guild_id: int | None,
        channel_id: int | None,
        work: Path,
    ) -> tuple[list[discord.File], str, list[int]]:
        """The recap clip to attach (none when it cannot be), a note saying why there is none, and the turns whose
        clips it joins; its file is in ``work``, which the caller keeps until it is sent."""
        rules = await ClipRules.of(
            self.bot.settings, self.bot.sessions, self.bot, guild_id, channel_id
        )  # a clip withheld here stays out of the recap
        kept = [(turn.id, turn.clip_key) for turn, _ in turns if turn.clip_key and rules.shown_again(turn.safety)]
        clips = await asyncio.to_thread(lambda: [(turn_id, key) for turn_id, key in kept if self.bot.clips.exists(key)])
        if not clips:
            return [], "\n(No clips are left to join.)", []
        try:
            # Joining and encoding block for up to a minute: off the event loop, so every other command still runs.
            path, made = await asyncio.to_thread(recap_file, self.bot.clips, story_id, clips, limit, work)
        except ClipTooLarge as exc:
            log.warning("story %s recap without a clip: %s", story_id, exc)
            return [], "\n(The recap clip is too large to attach, even re-encoded.)", []
        except (OSError, ValueError, av.FFmpegError) as exc:  # a clip file unreadable or not a video
            log.warning("story %s recap without a clip: %s", story_id, exc)
            return [], "\n(The recap clip could not be made.)", []
        log.info("story %s recap: %s", story_id, "made" if made else "reused")
        return [discord.File(path, f"story_{story_id}.mp4")], "", [turn_id for turn_id, _ in clips]

    @app_commands.command(name="page", description="The story so far as one web page, clips and all")
    async def page(self, interaction: discord.Interaction) -> None:
        story = await self._story(interaction)
        await defer_publicly(interaction)
        async with self.bot.sessions() as session:
            turns = await story_turns(session, story.id)
        if not turns:
            raise Refusal("Nothing has happened in this story yet.")
        rules = await ClipRules.of(
            self.bot.settings, self.bot.sessions, self.bot, interaction.guild_id, interaction.channel_id
        )
        shown = {turn.id for turn, _ in turns if rules.shown_again(turn.safety)}  # the others: text only
        # Reading and base64-encoding every clip blocks: off the event loop, so every other command still runs.
        page, left_out = await asyncio.to_thread(
            story_page, story.title, turns, self.bot.clips, self._upload_limit(interaction), shown
        )
        note = f" The {left_out} oldest clips did not fit in one file." if left_out else ""
        title = discord.utils.escape_markdown(story.title)
        text = f"📖 **{title}**, {len(turns)} turns: open the page in a browser.{note}"
        message = await fill(interaction, text, files=[discord.File(io.BytesIO(page), f"story_{story.id}.html")])
        held = [turn.id for turn, _ in turns if turn.id in shown and turn.clip_key]
        if held:
            await self._posted_copy(PAGE, story.id, message, held)

    async def _posted_copy(
        self, kind: str, story_id: int, message: discord.Message, held: list[int], key: str | None = None
    ) -> None:
        """Remember a posted recap or page with the turns whose clips it holds: removing one of them deletes it."""
        guild_id, channel_id = (message.guild.id if message.guild else None), message.channel.id
        async with self.bot.sessions() as session, session.begin():
            kept = await clip_copies.record(session, kind, story_id, guild_id, channel_id, message.id, held, key)
        if not kept:  # a clip it holds was removed while it was being made
            await take_down_withdrawn(self.bot, self.bot.sessions)

    def _upload_limit(self, interaction: discord.Interaction) -> int:
        """What one file may weigh here: the server's limit, less room for the message, or the setting if lower."""
        limit = interaction.filesize_limit - 64 * 1024
        if self.bot.settings.upload_limit_bytes:
            limit = min(limit, self.bot.settings.upload_limit_bytes)
        return limit

    @app_commands.command(name="end", description="Archive this channel's story")
    async def end(self, interaction: discord.Interaction) -> None:
        story = await self._story(interaction)
        if story.created_by != interaction.user.id and not interaction.permissions.manage_guild:
            raise Refusal("Only the story's creator or a server manager can end it.")
        await defer_publicly(interaction)
        async with self.bot.sessions() as session, session.begin():
            await end_story(session, story)
        await owe(self.bot.sessions, self.bot.clips, [every_recap(self.bot.clips, story.id)])  # outlives an outage
        await fill(
            interaction,
            f"📕 **{discord.utils.escape_markdown(story.title)}** is archived; /story start begins a new one here.",
        )


async def setup(bot: AnimeGamerBot) -> None:
    await bot.add_cog(Stories(bot))
