"""The one path every turn takes: /act, /story act, Reroll and Continue all end here.

Checks run first, cheapest first and all before any GPU work: banned, channel, paused,
instruction grammar and blocked terms, character, a turn in flight, quota, the server's queue
cap. Then the Turn and Job rows are committed, the task is sent (after the commit, so a worker
never races a missing row), and the player gets a public progress message within Discord's
3-second deadline. The delivery loop takes it from there.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import discord

from bot.errors import Refusal, answer_privately
from bot.queue import QueueUnavailable
from db import moderation
from db.models import Character, GuildSettings, JobKind, Story, TurnOrder
from db.queries import (
    active_character,
    average_turn_seconds,
    build_history,
    create_turn,
    fail_job,
    get_guild_settings,
    has_turn_in_flight,
    member_of_story,
    next_in_turn,
    queue_position,
    set_job_messages,
)
from game.contract import TurnRequest
from game.instruction import Instruction, InstructionError, from_fields, parse
from worker.celery_app import queue_for

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from bot.app import AnimeGamerBot

SEED_LIMIT = 2**63
ETA_GUESS_SECONDS = {"tiny": 5.0, "full": 120.0}  # before any turn has been timed here
BAR_CELLS = 12


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


async def check_may_play(session: AsyncSession, guild_id: int, channel_id: int, user_id: int) -> GuildSettings:
    """Who, where and whether: the refusals that need no instruction. Returns the guild's settings,
    read once here for every later check of the same turn."""
    ban = await moderation.find_ban(session, guild_id, user_id)
    if ban is not None:
        raise Refusal("You are banned from the game on this server" + (f": {ban.reason}." if ban.reason else "."))
    if not await moderation.channel_allowed(session, guild_id, channel_id):
        channels = await moderation.list_channels(session, guild_id)
        raise Refusal("The game is not played in this channel; try " + ", ".join(f"<#{c}>" for c in channels) + ".")
    settings = await get_guild_settings(session, guild_id)
    if settings.paused:
        raise Refusal("Generation is paused on this server; an admin can /admin resume it.")
    return settings


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

    async with bot.sessions() as session, session.begin():
        settings = await check_may_play(session, guild_id, channel_id, user_id)
        character = await active_character(session, guild_id, user_id)
        if character is None:
            raise Refusal("Pick your character first with /start.")
        instruction = read_instruction(typed, character.name)
        await check_instruction(session, guild_id, instruction, character)
        await check_capacity(session, settings, user_id, character)
        if story is not None:
            await check_story_turn(session, story, character)
        history = await build_history(session, story or character, settings.history_window)
        turn, job = await create_turn(
            session,
            character,
            str(instruction),
            secrets.randbelow(SEED_LIMIT),
            bot.settings.model,
            story=story,
            kind=kind,
            guild_id=guild_id,
            channel_id=channel_id,
            user_id=user_id,
        )
        request = TurnRequest(job_id=str(job.id), instruction=turn.instruction, seed=turn.seed, history=history)
        job_id, task_id = job.id, job.task_id
        ahead = await queue_position(session, job.id) or 0
        each = await average_turn_seconds(session, ETA_GUESS_SECONDS.get(bot.settings.model, 60.0))

    await interaction.response.defer(thinking=True)
    try:
        await bot.queue.send(request, task_id, queue_for(bot.settings, instruction.character))
    except QueueUnavailable:
        async with bot.sessions() as session, session.begin():
            await fail_job(session, job_id, "the queue was unreachable")
        await interaction.delete_original_response()
        await answer_privately(interaction, "The queue is unreachable right now; nothing was charged. Try again soon.")
        return
    message = await interaction.edit_original_response(content=queued_text(str(instruction), ahead, each))
    async with bot.sessions() as session, session.begin():
        await set_job_messages(session, job_id, progress_message_id=message.id)


async def check_instruction(
    session: AsyncSession, guild_id: int, instruction: Instruction, character: Character
) -> None:
    if instruction.character.casefold() != character.name.casefold():
        raise Refusal(f"You play {character.name} here; /start character:{instruction.character} to switch.")
    # The player's words only: the grammar's labels ("Motion:") are ours and must not trip a term.
    words = f"{instruction.character} {instruction.motion} {instruction.background}"
    term = await moderation.find_blocked_term(session, guild_id, words)
    if term is not None:
        raise Refusal("That instruction uses a term this server blocks; please rephrase it.")


async def check_capacity(session: AsyncSession, settings: GuildSettings, user_id: int, character: Character) -> None:
    await moderation.hold_character(session, character.id)
    if await has_turn_in_flight(session, character):
        raise Refusal("Your last turn is still being made; wait for it, or /cancel it.")
    guild_id = settings.guild_id
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
    if await member_of_story(session, story.id, character.id) is None:
        raise Refusal("Join this story first with /story join.")
    if story.turn_order == TurnOrder.ROUND_ROBIN:
        due = await next_in_turn(session, story)
        if due is not None and due != character.id:
            due_name = (await session.get(Character, due)).name
            raise Refusal(f"This story goes in turns; it is {due_name}'s turn.")


def queued_text(instruction: str, ahead: int, seconds_each: float) -> str:
    eta = int(time.time() + (ahead + 1) * seconds_each)
    place = "next in line" if ahead == 0 else f"{ahead} turn{'s' if ahead != 1 else ''} ahead"
    return f"🎬 {instruction}\nQueued, {place}; ready <t:{eta}:R>."


def progress_text(instruction: str, stage: str, step: int, total: int) -> str:
    if stage == "denoise" and total:
        filled = round(BAR_CELLS * step / total)
        bar = "▰" * filled + "▱" * (BAR_CELLS - filled)
        return f"🎬 {instruction}\nAnimating {bar} {100 * step // total}%"
    words = {"loading": "Loading the model…", "mllm": "Imagining the turn…", "vae": "Rendering frames…"}
    return f"🎬 {instruction}\n{words.get(stage, 'Finishing the clip…')}"
