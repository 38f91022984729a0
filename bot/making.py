"""The one function that makes a turn, whoever asks: /act, /story act, Reroll and Continue (bot/turns.py, after their
checks, under the server's lock) and a vote round's winner (bot/rounds.py, as the round closes).

Before, a round's winner was made by code of its own beside ``submit_turn``: a check added to one was silently
skipped by the other. What must hold for every turn, whoever asks, is checked here at the moment of the write: the
instruction reads under this version's grammar, and it uses no term the server blocks now (a vote's winner was
checked when it was proposed, and a term may have been blocked since). A refusal comes before any write, so a
caller's transaction keeps what it did before (a round still closes).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from bot.errors import Refusal
from db import moderation
from db.jobs import SEED_LIMIT, create_turn
from db.models import Character, Job, JobKind, Story, Turn
from game.instruction import Instruction, InstructionError, parse
from relay.celery_app import RELEASE_MODEL

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from relay.settings import Settings

BLOCKED = "That instruction uses a term this server blocks; please rephrase it."


def model_key(settings: Settings, character: str) -> str:
    """Which weights make this character's representations: one pair per character for the published model."""
    return f"{RELEASE_MODEL}:{character.casefold()}" if settings.model == RELEASE_MODEL else settings.model


async def check_terms(session: AsyncSession, guild_id: int, instruction: Instruction) -> None:
    """The player's words only: the grammar's labels ("Motion:") are ours and must not trip a term."""
    words = f"{instruction.character} {instruction.motion} {instruction.background}"
    if await moderation.find_blocked_term(session, guild_id, words) is not None:
        raise Refusal(BLOCKED)


async def make_turn(
    session: AsyncSession,
    settings: Settings,
    character: Character | int,
    instruction: str,
    *,
    guild_id: int,
    channel_id: int,
    user_id: int | None,
    story: Story | None = None,
    kind: JobKind = JobKind.ACT,
) -> tuple[Turn, Job]:
    """Check what must hold for every turn, then write it and its job, not yet sent (the caller commits, and the
    outbox sends it). ``Refusal`` before any write when a check fails."""
    try:
        parsed = parse(instruction)
    except InstructionError as exc:
        raise Refusal(str(exc)) from exc
    await check_terms(session, guild_id, parsed)
    return await create_turn(
        session,
        character,
        str(parsed),
        secrets.randbelow(SEED_LIMIT),
        settings.model,
        model_key=model_key(settings, parsed.character),
        story=story,
        kind=kind,
        guild_id=guild_id,
        channel_id=channel_id,
        user_id=user_id,
    )
