"""The one path every turn takes: /act, /story act, Reroll and Continue all end here.

Discord first: the bot checks it may post in the channel (from the interaction itself, no
call), then defers publicly, within milliseconds and before any database write or broker call
that can wait. Then the checks, cheapest first and all before any GPU work: banned, channel,
paused, instruction grammar and blocked terms, character served, a turn in flight, quota, the
server's queue cap. Then one transaction commits the Turn and its Job, not yet sent; the
deferred answer becomes the progress message, and the supervisor's outbox sends the task
(right away, through ``Outbox.send_now``, or on its next tick if the bot died in between).
A refusal after the public defer removes it and answers privately (``bot.errors``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple

import discord
from sqlalchemy import select

from bot.cards import queued_text
from bot.errors import PUBLIC_DEFER, Refusal, defer_publicly
from bot.making import check_terms, make_turn
from bot.outbox import ETA_GUESS_SECONDS
from db import moderation
from db.jobs import (
    average_turn_seconds,
    player_has_turn_in_flight,
    queue_position,
    seconds_between_turns,
    set_job_messages,
    waits_for_story,
)
from db.models import Character, GuildSettings, JobKind, Story, StoryStatus, Turn, TurnOrder
from db.queries import active_character, get_guild_settings, member_of_story, next_in_turn
from game.errors import TurnInFlightError
from game.instruction import Instruction, InstructionError, from_fields, parse

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from bot.app import AnimeGamerBot

log = logging.getLogger(__name__)


# What the bot needs in a channel to deliver a turn, by the names Discord's settings use.
NEEDED = {
    "send_messages": "Send Messages",
    "attach_files": "Attach Files",
    "embed_links": "Embed Links",
    "read_message_history": "Read Message History",  # a reply to the progress message needs it
}


@dataclass(frozen=True)
class TurnInput:
    """What the player typed: a whole instruction line, or fields (character and time optional)."""

    instruction: str | None = None
    motion: str | None = None
    background: str | None = None
    character: str | None = None
    time: str | None = None


def read_instruction(typed: TurnInput, playing: str) -> Instruction:
    try:
        if typed.instruction:
            if typed.motion or typed.background:
                raise Refusal("Give either `instruction` or `motion` + `background`, not both.")
            return parse(typed.instruction)
        if not (typed.motion and typed.background):
            raise Refusal("Give `motion` and `background`, or a whole `instruction` line.")
        return from_fields(typed.character or playing, typed.motion, typed.background, time=typed.time or "")
    except InstructionError as exc:
        raise Refusal(str(exc)) from exc


def check_can_deliver(interaction: discord.Interaction) -> None:
    """Refuse before any work if the bot could not post the clip here (Discord says what it may do)."""
    permissions = interaction.app_permissions
    channel = interaction.channel
    in_thread = isinstance(channel, discord.Thread) or getattr(channel, "type", None) in (
        discord.ChannelType.public_thread,
        discord.ChannelType.private_thread,
        discord.ChannelType.news_thread,
    )
    needed = dict(NEEDED)
    if in_thread:
        needed["send_messages_in_threads"] = needed.pop("send_messages").replace("Messages", "Messages in Threads")
    missing = [name for flag, name in needed.items() if not getattr(permissions, flag)]
    if missing:
        raise Refusal(f"I cannot post your clip here: I need {', '.join(missing)} in this channel. Ask an admin.")


async def check_may_play(session: AsyncSession, guild_id: int, channel_id: int, user_id: int) -> GuildSettings:
    """Who, where and whether: the refusals that need no instruction. Returns the guild's settings,
    read once here for every later check of the same turn."""
    ban = await moderation.find_ban(session, guild_id, user_id)
    if ban is not None:
        reason = f": {discord.utils.escape_markdown(ban.reason)}." if ban.reason else "."
        raise Refusal("You are banned from the game on this server" + reason)
    if not await moderation.channel_allowed(session, guild_id, channel_id):
        channels = await moderation.list_channels(session, guild_id)
        raise Refusal("The game is not played in this channel; try " + ", ".join(f"<#{c}>" for c in channels) + ".")
    settings = await get_guild_settings(session, guild_id)
    if settings.paused:
        raise Refusal("Generation is paused on this server; an admin can /admin resume it.")
    return settings


def check_served(bot: AnimeGamerBot, character: str) -> None:
    """A character no running worker serves would wait forever: refuse it with the ones that are served."""
    served = bot.served_characters()
    if served is not None and character.casefold() not in {name.casefold() for name in served}:
        offer = ", ".join(served) if served else "none right now"
        raise Refusal(f"No worker plays {character}; characters being served: {offer}.")


class CheckedTurn(NamedTuple):
    settings: GuildSettings  # the server's, read once for every later check of the same turn
    character: Character
    instruction: Instruction


async def check_turn(
    bot: AnimeGamerBot, session: AsyncSession, guild_id: int, channel_id: int, user_id: int, typed: TurnInput
) -> CheckedTurn:
    """Every check a command that makes or proposes a turn makes before any write, cheapest first: banned,
    channel, paused, a character picked, the instruction's grammar, the character served, blocked terms."""
    settings = await check_may_play(session, guild_id, channel_id, user_id)
    character = await active_character(session, guild_id, user_id)
    if character is None:
        raise Refusal("Pick your character first with /start.")
    instruction = read_instruction(typed, character.name)
    check_served(bot, instruction.character)
    await check_instruction(session, guild_id, instruction, character)
    return CheckedTurn(settings, character, instruction)


async def submit_turn(
    bot: AnimeGamerBot,
    interaction: discord.Interaction,
    typed: TurnInput,
    *,
    story: Story | None = None,
    kind: JobKind = JobKind.ACT,
) -> None:
    guild_id, channel_id, user_id = interaction.guild_id, interaction.channel_id, interaction.user.id
    if guild_id is None or channel_id is None:
        raise Refusal("The game is played in a server channel.")
    check_can_deliver(interaction)
    await defer_publicly(interaction)

    # Who, where and what: reads only, so they need no turn at the database's one writer.
    async with bot.sessions() as session:
        settings, found, instruction = await check_turn(bot, session, guild_id, channel_id, user_id, typed)
        each = await average_turn_seconds(session, ETA_GUESS_SECONDS.get(bot.settings.model, 60.0))
        gap = await seconds_between_turns(session, each)

    # What must be counted and written at once: the server's lock, its limits, the turn and its job.
    async with bot.submitting, bot.sessions() as session, session.begin():
        character = await session.get(Character, found.id)
        if character is None or not character.is_active:  # switched or reset a moment ago
            raise Refusal("Your character just changed; try /act again.")
        await check_capacity(session, settings, user_id, character)
        if story is not None:
            await check_story_turn(session, story, character)
        turn, job = await make_turn(
            session,
            bot.settings,
            character,
            str(instruction),
            story=story,
            kind=kind,
            guild_id=guild_id,
            channel_id=channel_id,
            user_id=user_id,
        )
        ahead = await queue_position(session, job.id) or 0
        eta = timedelta(seconds=each + ahead * gap)  # its own turn, and one finish for each turn ahead
        if story is None or not await _waits(session, turn):
            job.deadline_at = bot.outbox.clock.now() + bot.limits.pickup_for(eta)
        job_id = job.id

    log.info("job %s queued (guild %s, user %s)", job_id, guild_id, user_id)
    bot.notices.remember(job_id, interaction)
    waiting = story is not None and job.deadline_at is None
    text = queued_text(str(instruction), ahead, each + ahead * gap, after_story_turn=waiting)
    try:
        message = await interaction.edit_original_response(content=text)
        interaction.extras.pop(PUBLIC_DEFER, None)  # filled: a refusal now would be a followup
        async with bot.sessions() as session, session.begin():
            await set_job_messages(session, job_id, progress_message_id=message.id)
    except discord.HTTPException as exc:  # the turn is committed: it is made and posted all the same
        log.warning("job %s: progress message not shown (%s)", job_id, exc)
        return await _send(bot, job_id, interaction, None)
    await _send(bot, job_id, interaction, message)


async def _send(
    bot: AnimeGamerBot, job_id: int, interaction: discord.Interaction, shown: discord.Message | None
) -> None:
    """Send the committed turn now; if the queue is down, say the turn waits for it (the outbox sends it later)."""
    if await bot.outbox.send_now(job_id) or shown is None:
        return
    note = (
        "\nThe queue is not answering right now: your turn waits for it, and is dropped uncharged if it takes too long."
    )
    try:
        await interaction.edit_original_response(content=shown.content + note)
    except discord.HTTPException as exc:
        log.info("job %s: progress message not updated (%s)", job_id, exc)


async def _waits(session: AsyncSession, turn: Turn) -> bool:
    """Whether this story turn waits for the one before it (then its deadline starts when that one ends)."""
    return bool((await session.execute(select(waits_for_story()).where(Turn.id == turn.id))).scalar())


async def check_instruction(
    session: AsyncSession, guild_id: int, instruction: Instruction, character: Character
) -> None:
    if instruction.character.casefold() != character.name.casefold():
        raise Refusal(f"You play {character.name} here; /start character:{instruction.character} to switch.")
    await check_terms(session, guild_id, instruction)


async def check_capacity(session: AsyncSession, settings: GuildSettings, user_id: int, character: Character) -> None:
    """One turn in flight per player, the hourly quota, the server's queue cap: counted under the
    server's lock, so two bots or shards submitting at once count each other's turns (``hold_guild``)."""
    guild_id = settings.guild_id
    await moderation.hold_guild(session, guild_id)
    if await player_has_turn_in_flight(session, guild_id, user_id):
        raise TurnInFlightError()  # the database refuses a second one anyway; this says so before any work
    if settings.turns_per_hour == 0 or settings.max_queued_turns == 0:
        # A limit of 0 never resets on its own, so "try later" would be wrong.
        raise Refusal("Play is switched off on this server for now; an admin can change that with /admin quota.")
    count, oldest = await moderation.turns_in_last_hour(session, guild_id, user_id)
    if count >= settings.turns_per_hour:
        resets = int((oldest + timedelta(hours=1)).timestamp()) if oldest else int(time.time()) + 3600
        raise Refusal(f"You reached this server's {_turns(settings.turns_per_hour)} per hour; more <t:{resets}:R>.")
    if await moderation.queued_in_guild(session, guild_id) >= settings.max_queued_turns:
        raise Refusal(f"This server's queue is full ({_turns(settings.max_queued_turns)}); try again in a few minutes.")


def _turns(count: int) -> str:
    return f"{count} turn" if count == 1 else f"{count} turns"


async def check_story_turn(session: AsyncSession, story: Story, character: Character) -> None:
    status = (await session.execute(select(Story.status).where(Story.id == story.id))).scalar_one_or_none()
    if status != StoryStatus.ACTIVE:
        raise Refusal("This story has ended; start a new one with /story start.")
    if await member_of_story(session, story.id, character.id) is None:
        raise Refusal("Join this story first with /story join.")
    if story.turn_order == TurnOrder.ROUND_ROBIN:
        due = await next_in_turn(session, story)
        if due is not None and due != character.id:
            due_name = (await session.get(Character, due)).name
            raise Refusal(f"This story goes in turns; it is {due_name}'s turn.")
