"""What players and stories did: the counts behind ``/profile`` and ``/board``.

Only finished turns count (``stamina_after`` is set once a turn's result is applied): a turn still queued,
failed or cancelled was not played.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from db.models import Character, Player, Story, StoryMember, Turn

FAVOURITE_LINES = 1000  # the newest lines a profile's favourite actions are counted from
BOARD_ROWS = 5


@dataclass(frozen=True)
class Profile:
    character: Character | None  # the one played now
    turns: int  # finished turns, every character of the player in this server
    stories: int  # stories joined
    lines: list[str] = field(default_factory=list)  # the newest finished turns' instructions


@dataclass(frozen=True)
class Board:
    players: list[tuple[int, str, int]]  # (user id, character played now, turns), most turns first
    stories: list[tuple[str, int]]  # (title, turns), most turns first


async def profile(session: AsyncSession, guild_id: int, user_id: int) -> Profile | None:
    """A player's counts in this server; None for someone who never picked a character here."""
    player = (
        await session.execute(select(Player.id).where(Player.guild_id == guild_id, Player.user_id == user_id))
    ).scalar_one_or_none()
    if player is None:
        return None
    mine = select(Character.id).where(Character.player_id == player).scalar_subquery()
    finished = select(Turn.instruction).where(Turn.character_id.in_(mine), Turn.stamina_after.is_not(None))
    turns = (await session.execute(select(func.count()).select_from(finished.subquery()))).scalar_one()
    lines = (await session.execute(finished.order_by(Turn.id.desc()).limit(FAVOURITE_LINES))).scalars().all()
    stories = (
        await session.execute(
            select(func.count(func.distinct(StoryMember.story_id))).where(StoryMember.character_id.in_(mine))
        )
    ).scalar_one()
    character = (
        await session.execute(select(Character).where(Character.player_id == player, Character.is_active))
    ).scalar_one_or_none()
    return Profile(character, turns, stories, list(lines))


async def board(session: AsyncSession, guild_id: int, since: datetime) -> Board:
    """This server's most active players and stories since ``since``."""
    played = func.count(Turn.id).label("played")
    finished = (Turn.stamina_after.is_not(None), Turn.created_at >= since)
    players = (
        await session.execute(
            select(Player.id, Player.user_id, played)
            .join(Character, Character.player_id == Player.id)
            .join(Turn, Turn.character_id == Character.id)
            .where(Player.guild_id == guild_id, *finished)
            .group_by(Player.id, Player.user_id)
            .order_by(played.desc(), Player.id)
            .limit(BOARD_ROWS)
        )
    ).all()
    names = dict(
        (
            await session.execute(
                select(Character.player_id, Character.name).where(
                    Character.player_id.in_([row.id for row in players]), Character.is_active
                )
            )
        ).all()
    )
    stories = (
        await session.execute(
            select(Story.title, played)
            .join(Turn, Turn.story_id == Story.id)
            .where(Story.guild_id == guild_id, *finished)
            .group_by(Story.id, Story.title)
            .order_by(played.desc(), Story.id)
            .limit(BOARD_ROWS)
        )
    ).all()
    return Board(
        [(row.user_id, names.get(row.id, "?"), row.played) for row in players],
        [(row.title, row.played) for row in stories],
    )
