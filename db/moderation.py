"""The queries behind moderation and server settings: bans, blocked terms, channels, quotas, audit.

Like ``db.queries``: each takes the session first and never commits. Every admin action also
writes an audit row (``audit``), in the same transaction as the change it records.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from db import clip_copies, clip_deletes
from db.base import utcnow
from db.jobs import status_in
from db.models import (
    DEFAULT_SAFETY_POLICY,
    IN_FLIGHT,
    AllowedChannel,
    AuditLog,
    Ban,
    BlockedTerm,
    Character,
    GuildSettings,
    Job,
    JobStatus,
    Player,
    Story,
    StoryRound,
    StoryVote,
    Turn,
)
from db.queries import get_guild_settings, get_or_create_guild, insert_ignore
from game.safety import SafetyPolicy
from game.text import TextError, clean_text, find_term, skeleton


async def find_ban(session: AsyncSession, guild_id: int, user_id: int) -> Ban | None:
    return (
        await session.execute(select(Ban).where(Ban.guild_id == guild_id, Ban.user_id == user_id))
    ).scalar_one_or_none()


async def ban(session: AsyncSession, guild_id: int, user_id: int, reason: str | None, banned_by: int) -> bool:
    """Ban a player from the game in this guild; False if already banned (the reason is updated)."""
    await get_or_create_guild(session, guild_id)
    existing = await find_ban(session, guild_id, user_id)
    if existing is not None:
        existing.reason = reason
        return False
    session.add(Ban(guild_id=guild_id, user_id=user_id, reason=reason, banned_by=banned_by))
    await session.flush()
    return True


async def unban(session: AsyncSession, guild_id: int, user_id: int) -> bool:
    result = await session.execute(
        delete(Ban).where(Ban.guild_id == guild_id, Ban.user_id == user_id).returning(Ban.id)
    )
    return result.first() is not None


def normalize_term(term: str) -> str:
    """How a blocked term is stored: clean text (as every free-text option), case-folded.

    Raises TextError for text that is not clean, and for a term with no letter or digit (``---``): terms
    match on their skeleton (``game.text.skeleton``), which keeps letters and digits only, so it would match
    nothing.
    """
    folded = clean_text(term, label="A blocked term", max_chars=100).casefold()
    # Cleaned again: the fold can lengthen (``ß`` -> ``ss``) or decompose (``ǰ``), and the column holds 100.
    term = clean_text(folded, label="A blocked term", max_chars=100)
    if not skeleton(term):
        raise TextError("A blocked term needs a letter or digit.")
    return term


async def add_term(session: AsyncSession, guild_id: int, term: str, added_by: int) -> bool:
    """Block a term; False if it already was. Raises TextError for a term ``normalize_term`` refuses."""
    term = normalize_term(term)
    await get_or_create_guild(session, guild_id)
    before = await list_terms(session, guild_id)
    await insert_ignore(session, BlockedTerm, guild_id=guild_id, term=term, added_by=added_by)
    return term not in before


async def remove_term(session: AsyncSession, guild_id: int, term: str) -> bool:
    """Unblock a term, typed as it was blocked; terms stored before ``normalize_term`` cleaned them match too."""
    stored = {" ".join(term.split()).lower()}  # the earlier rule: runs of spaces as one, lower case
    with contextlib.suppress(TextError):
        stored.add(normalize_term(term))
    result = await session.execute(
        delete(BlockedTerm)
        .where(BlockedTerm.guild_id == guild_id, BlockedTerm.term.in_(stored))
        .returning(BlockedTerm.id)
    )
    return result.first() is not None


async def list_terms(session: AsyncSession, guild_id: int) -> list[str]:
    stmt = select(BlockedTerm.term).where(BlockedTerm.guild_id == guild_id).order_by(BlockedTerm.term)
    return list((await session.execute(stmt)).scalars())


async def find_blocked_term(session: AsyncSession, guild_id: int, text: str) -> str | None:
    """The first blocked term the text spells, however disguised; checked before any GPU work.

    Matching is on skeletons (``game.text.find_term``: look-alikes, case, accents, spacing and punctuation
    ignored), so the term ``zorb-lax`` catches ``z o r b l a x`` and ``ｚｏｒｂｌａｘ``.
    """
    return find_term(text, await list_terms(session, guild_id))


async def allow_channel(session: AsyncSession, guild_id: int, channel_id: int) -> None:
    await get_or_create_guild(session, guild_id)
    await insert_ignore(session, AllowedChannel, guild_id=guild_id, channel_id=channel_id)


async def deny_channel(session: AsyncSession, guild_id: int, channel_id: int) -> bool:
    result = await session.execute(
        delete(AllowedChannel)
        .where(AllowedChannel.guild_id == guild_id, AllowedChannel.channel_id == channel_id)
        .returning(AllowedChannel.channel_id)
    )
    return result.first() is not None


async def list_channels(session: AsyncSession, guild_id: int) -> list[int]:
    stmt = select(AllowedChannel.channel_id).where(AllowedChannel.guild_id == guild_id)
    return sorted((await session.execute(stmt)).scalars())


async def channel_allowed(session: AsyncSession, guild_id: int, channel_id: int) -> bool:
    """A guild with no allowed channels listed allows play everywhere."""
    channels = await list_channels(session, guild_id)
    return not channels or channel_id in channels


async def audit(
    session: AsyncSession, guild_id: int, actor_id: int, action: str, target: str | None = None, details: str = ""
) -> None:
    await get_or_create_guild(session, guild_id)
    session.add(AuditLog(guild_id=guild_id, actor_id=actor_id, action=action, target=target, details=details or None))
    await session.flush()


async def recent_audit(session: AsyncSession, guild_id: int, limit: int = 15) -> list[AuditLog]:
    stmt = select(AuditLog).where(AuditLog.guild_id == guild_id).order_by(AuditLog.id.desc()).limit(limit)
    return list((await session.execute(stmt)).scalars())


async def hold_guild(session: AsyncSession, guild_id: int) -> None:
    """Lock the server until the transaction ends, so turns submitted at once in one server are checked
    one after the other: the hourly quota and the server's queue cap count what the one before
    committed, whichever bot or shard took it.

    PostgreSQL locks the settings row (FOR UPDATE; READ COMMITTED reads anew after it). SQLite ignores
    FOR UPDATE and takes its one writer's lock only at a transaction's first write, after the checks:
    a write that changes nothing takes it here instead. One turn in flight per player needs no lock: a
    unique index holds it (``db.jobs.create_turn``).
    """
    if session.get_bind().dialect.name == "sqlite":
        same = update(GuildSettings).where(GuildSettings.guild_id == guild_id).values(guild_id=GuildSettings.guild_id)
        await session.execute(same)
    else:
        held = select(GuildSettings.guild_id).where(GuildSettings.guild_id == guild_id).with_for_update()
        await session.execute(held)


async def turns_in_last_hour(session: AsyncSession, guild_id: int, user_id: int) -> tuple[int, datetime | None]:
    """How many turns the player sent in the last hour, and when the oldest of them was sent.

    Failed and expired turns do not count: the worker could not make them, or no worker took them
    in time, and the player was told to try again. Cancelled ones count: the player chose that.
    """
    since = utcnow() - timedelta(hours=1)
    stmt = select(func.count(), func.min(Job.queued_at)).where(
        Job.guild_id == guild_id,
        Job.user_id == user_id,
        Job.queued_at >= since,
        Job.status.not_in((JobStatus.FAILED, JobStatus.EXPIRED)),
    )
    count, oldest = (await session.execute(stmt)).one()
    return count, oldest


async def queued_in_guild(session: AsyncSession, guild_id: int) -> int:
    stmt = select(func.count()).select_from(Job).where(Job.guild_id == guild_id, status_in(*IN_FLIGHT))
    return (await session.execute(stmt)).scalar_one()


async def stories_of_player(session: AsyncSession, guild_id: int, user_id: int) -> list[int]:
    """The stories a player's turns are part of: their recaps show those turns."""
    stmt = (
        select(Turn.story_id)
        .join(Character, Turn.character_id == Character.id)
        .join(Player, Character.player_id == Player.id)
        .where(Player.guild_id == guild_id, Player.user_id == user_id, Turn.story_id.is_not(None))
        .distinct()
    )
    return list((await session.execute(stmt)).scalars())


async def purge_player(session: AsyncSession, guild_id: int, user_id: int) -> tuple[list[str], int]:
    """Delete a player's characters, turns and jobs (privacy); returns the keys of the clips to delete and how many
    posted recaps and story pages holding their clips were withdrawn (bot/clip_copies.py deletes them).

    Turns of shared stories go too: they are the player's content.
    """
    # Their votes in this server's rounds (their proposals go with their characters, and the votes for them).
    rounds = select(StoryRound.id).join(Story, Story.id == StoryRound.story_id).where(Story.guild_id == guild_id)
    await session.execute(delete(StoryVote).where(StoryVote.user_id == user_id, StoryVote.round_id.in_(rounds)))
    player = (
        await session.execute(select(Player).where(Player.guild_id == guild_id, Player.user_id == user_id))
    ).scalar_one_or_none()
    if player is None:
        return [], 0
    clips = (
        await session.execute(
            select(Turn.clip_key)
            .join(Character, Turn.character_id == Character.id)
            .where(Character.player_id == player.id, Turn.clip_key.is_not(None))
        )
    ).scalars()
    keys = [key for key in clips if key]
    await clip_deletes.record(session, keys)  # in this transaction: the rows that name them go with it
    turns = select(Turn.id).join(Character, Turn.character_id == Character.id).where(Character.player_id == player.id)
    copies, _ = await clip_copies.withdraw(session, list((await session.execute(turns)).scalars()))  # before rows go
    await session.execute(delete(Player).where(Player.id == player.id))
    return keys, copies


@dataclass(frozen=True)
class GuildStats:
    players: int
    turns_today: int
    queue_length: int
    average_turn_seconds: float | None


async def guild_stats(session: AsyncSession, guild_id: int) -> GuildStats:
    since = utcnow() - timedelta(days=1)
    players = (await session.execute(select(func.count()).where(Player.guild_id == guild_id))).scalar_one()
    turns_today = (
        await session.execute(select(func.count()).where(Job.guild_id == guild_id, Job.queued_at >= since))
    ).scalar_one()
    done = (
        await session.execute(
            select(Job.queued_at, Job.finished_at)
            .where(Job.guild_id == guild_id, Job.status == JobStatus.DONE, Job.finished_at.is_not(None))
            .order_by(Job.id.desc())
            .limit(50)
        )
    ).all()
    average = sum((f - q).total_seconds() for q, f in done) / len(done) if done else None
    return GuildStats(players, turns_today, await queued_in_guild(session, guild_id), average)


async def set_quota(
    session: AsyncSession, guild_id: int, turns_per_hour: int | None, max_queued_turns: int | None
) -> tuple[int, int]:
    settings = await get_guild_settings(session, guild_id)
    if turns_per_hour is not None:
        settings.turns_per_hour = turns_per_hour
    if max_queued_turns is not None:
        settings.max_queued_turns = max_queued_turns
    await session.flush()
    return settings.turns_per_hour, settings.max_queued_turns


async def set_history_window(session: AsyncSession, guild_id: int, window: int | None) -> int:
    """Set how many turns each prompt spans (1: the current one alone); None only reads it."""
    settings = await get_guild_settings(session, guild_id)
    if window is not None:
        settings.history_window = window
    await session.flush()
    return settings.history_window


async def set_paused(session: AsyncSession, guild_id: int, paused: bool) -> bool:
    """Pause or resume generation; False if it already was so."""
    settings = await get_guild_settings(session, guild_id)
    changed = settings.paused != paused
    settings.paused = paused
    await session.flush()
    return changed


async def safety_of(session: AsyncSession, guild_id: int | None) -> tuple[SafetyPolicy, float | None]:
    """A server's safety policy and its own threshold (None: the operator's); read only, defaults for a stranger."""
    row = (
        await session.execute(
            select(GuildSettings.safety_policy, GuildSettings.safety_threshold).where(
                GuildSettings.guild_id == guild_id
            )
        )
    ).one_or_none()
    return (row[0], row[1]) if row is not None else (DEFAULT_SAFETY_POLICY, None)


async def set_safety(
    session: AsyncSession, guild_id: int, policy: SafetyPolicy | None, threshold: float | None
) -> tuple[SafetyPolicy, float | None]:
    """Set what a flagged clip gets and the score that flags one; None leaves either as it is."""
    settings = await get_guild_settings(session, guild_id)
    if policy is not None:
        settings.safety_policy = policy
    if threshold is not None:
        settings.safety_threshold = threshold
    await session.flush()
    return settings.safety_policy, settings.safety_threshold
