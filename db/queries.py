"""Guilds, players, characters and stories: the queries the bot and the CLI need besides jobs (``db.jobs``).

Each is ``async def f(session, ...)``. The caller owns the transaction (``async with Session() as
s, s.begin():``) and so decides what is one unit of work; nothing here commits. Functions that
create rows return the ORM objects, which the caller may use inside the same session.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase

from db import clip_deletes
from db.base import utcnow
from db.models import (
    AppState,
    Character,
    Guild,
    GuildSettings,
    Player,
    Story,
    StoryMember,
    StoryStatus,
    Turn,
    TurnOrder,
)
from game.errors import StoryClosedError
from game.instruction import MAX_FIELD_CHARS
from game.state import CharacterState

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Guilds, players, characters
# --------------------------------------------------------------------------------------------


async def insert_ignore(session: AsyncSession, model: type[DeclarativeBase], **values: Any) -> bool:
    """INSERT that does nothing when the row exists, so concurrent first uses do not collide; True if it inserted.

    A SELECT-then-INSERT would let two commands for a new guild both insert and one fail.
    """
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        stmt = sqlite.insert(model).values(**values).on_conflict_do_nothing()
    elif dialect == "postgresql":
        stmt = postgresql.insert(model).values(**values).on_conflict_do_nothing()
    else:  # pragma: no cover - only SQLite and PostgreSQL are supported
        raise NotImplementedError(f"no insert-or-ignore for {dialect}")
    return bool((await session.execute(stmt)).rowcount)


async def get_or_create_guild(session: AsyncSession, guild_id: int, name: str | None = None) -> Guild:
    """The guild's row, created with its settings row (column defaults) on first use."""
    await insert_ignore(session, Guild, id=guild_id, name=name or "")
    await insert_ignore(session, GuildSettings, guild_id=guild_id)
    guild = (await session.execute(select(Guild).where(Guild.id == guild_id))).scalar_one()
    if name is not None and guild.name != name:
        guild.name = name  # guilds get renamed; keep what admins see in the audit log current
    return guild


async def get_guild_settings(session: AsyncSession, guild_id: int) -> GuildSettings:
    """The guild's settings in one read (created with defaults if the guild is new)."""
    await get_or_create_guild(session, guild_id)
    return (await session.execute(select(GuildSettings).where(GuildSettings.guild_id == guild_id))).scalar_one()


async def get_or_create_player(session: AsyncSession, guild_id: int, user_id: int) -> Player:
    await get_or_create_guild(session, guild_id)
    await insert_ignore(session, Player, guild_id=guild_id, user_id=user_id)
    stmt = select(Player).where(Player.guild_id == guild_id, Player.user_id == user_id)
    return (await session.execute(stmt)).scalar_one()


async def get_or_create_character(session: AsyncSession, guild_id: int, user_id: int, name: str) -> Character:
    """The player's character called ``name`` (created at the starting stats if new), now active.

    A player plays one character at a time (a partial unique index enforces it), so the others
    are switched off first, in their own statement, before this one is switched on.
    """
    name = name.strip()
    if not name or len(name) > MAX_FIELD_CHARS:
        raise ValueError(f"a character name must be 1..{MAX_FIELD_CHARS} characters, got {len(name)}")
    player = await get_or_create_player(session, guild_id, user_id)
    await session.execute(
        update(Character)
        .where(Character.player_id == player.id, Character.name != name, Character.is_active.is_(True))
        .values(is_active=False)
    )
    await insert_ignore(session, Character, player_id=player.id, name=name, is_active=False)
    stmt = select(Character).where(Character.player_id == player.id, Character.name == name)
    # populate_existing: the UPDATE above bypassed any copies already in the identity map.
    character = (await session.execute(stmt.execution_options(populate_existing=True))).scalar_one()
    character.is_active = True
    await session.flush()
    return character


async def active_character(session: AsyncSession, guild_id: int, user_id: int) -> Character | None:
    stmt = (
        select(Character)
        .join(Player, Character.player_id == Player.id)
        .where(Player.guild_id == guild_id, Player.user_id == user_id, Character.is_active.is_(True))
    )
    return (await session.execute(stmt)).scalar_one_or_none()


# --------------------------------------------------------------------------------------------
# Stories
# --------------------------------------------------------------------------------------------


async def create_story(
    session: AsyncSession,
    guild_id: int,
    channel_id: int,
    title: str,
    created_by: int,
    turn_order: TurnOrder = TurnOrder.FREE,
) -> Story:
    """A new active story; raises ``IntegrityError`` if the channel already has one."""
    await get_or_create_guild(session, guild_id)
    story = Story(
        guild_id=guild_id, channel_id=channel_id, title=title, created_by=created_by, turn_order=TurnOrder(turn_order)
    )
    session.add(story)
    await session.flush()
    return story


async def active_story(session: AsyncSession, channel_id: int) -> Story | None:
    stmt = select(Story).where(Story.channel_id == channel_id, Story.status == StoryStatus.ACTIVE)
    return (await session.execute(stmt)).scalar_one_or_none()


async def join_story(session: AsyncSession, story: Story | int, character: Character | int) -> StoryMember:
    """Add a character to a story (or bring back one who left), last in the round-robin order."""
    story_id = _id(story)
    character_id = _id(character)
    status = (await session.execute(select(Story.status).where(Story.id == story_id))).scalar_one_or_none()
    if status != StoryStatus.ACTIVE:
        raise StoryClosedError(story_id)
    stmt = select(StoryMember).where(StoryMember.story_id == story_id, StoryMember.character_id == character_id)
    member = (await session.execute(stmt)).scalar_one_or_none()
    next_position = (
        await session.execute(
            select(func.coalesce(func.max(StoryMember.position) + 1, 0)).where(StoryMember.story_id == story_id)
        )
    ).scalar_one()
    if member is None:
        member = StoryMember(story_id=story_id, character_id=character_id, position=next_position)
        session.add(member)
    elif member.left_at is not None:
        member.left_at = None
        member.position = next_position
    await session.flush()
    return member


async def end_story(session: AsyncSession, story: Story | int) -> bool:
    """Archive a story (which frees its channel for a new one); False if it was not active."""
    result = await session.execute(
        update(Story)
        .where(Story.id == _id(story), Story.status == StoryStatus.ACTIVE)
        .values(status=StoryStatus.ARCHIVED, ended_at=utcnow())
        .returning(Story.id)
    )
    return _changed(result)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _id(obj: Any) -> int:
    return obj if isinstance(obj, int) else obj.id


def _changed(result: Any) -> bool:
    # RETURNING rather than rowcount: SQLite's driver reports rowcount for UPDATE ... RETURNING
    # only after the rows are fetched, and both backends support RETURNING.
    return result.scalar_one_or_none() is not None


# --------------------------------------------------------------------------------------------
# What the bot shows and resumes
# --------------------------------------------------------------------------------------------


async def recent_turns(session: AsyncSession, character_id: int, limit: int = 10) -> list[Turn]:
    """The character's latest completed turns, newest first."""
    stmt = (
        select(Turn)
        .where(Turn.character_id == character_id, Turn.stamina_after.is_not(None))
        .order_by(Turn.id.desc())
        .limit(limit)
    )
    return list((await session.execute(stmt)).scalars())


FORMER_PLAYER = "a former player"  # who a story turn is shown as from once its player started over


async def story_turns(session: AsyncSession, story_id: int) -> list[tuple[Turn, str]]:
    """A story's completed turns in order, each with the name of the character who played it."""
    stmt = (
        select(Turn, Character.name)
        .outerjoin(Character, Turn.character_id == Character.id)
        .where(Turn.story_id == story_id, Turn.stamina_after.is_not(None))
        .order_by(Turn.seq)
    )
    return [(turn, name or FORMER_PLAYER) for turn, name in (await session.execute(stmt)).all()]


async def reset_character(session: AsyncSession, character: Character) -> list[str]:
    """Start over: back to the starting stats, and the character's own past turns forgotten.

    Turns it played in shared stories belong to those stories too: they stay, detached from the
    character (shown as from a former player), so other players' story keeps no holes. The stored clips of the
    forgotten turns are owed to the store in this transaction (``db/clip_deletes.py``): returned, for the caller to
    delete once it commits; their rows gone, nothing else would ever delete them.
    """
    await session.execute(
        update(Turn).where(Turn.character_id == character.id, Turn.story_id.is_not(None)).values(character_id=None)
    )
    mine = Turn.character_id == character.id
    keys = list((await session.execute(select(Turn.clip_key).where(mine, Turn.clip_key.is_not(None)))).scalars())
    await clip_deletes.record(session, keys)
    await session.execute(delete(Turn).where(mine))
    character.stamina = character.social = character.entertainment = CharacterState().stamina
    await session.flush()
    return keys


async def member_of_story(session: AsyncSession, story_id: int, character_id: int) -> StoryMember | None:
    stmt = select(StoryMember).where(
        StoryMember.story_id == story_id, StoryMember.character_id == character_id, StoryMember.left_at.is_(None)
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def leave_story(session: AsyncSession, story_id: int, character_id: int) -> bool:
    member = await member_of_story(session, story_id, character_id)
    if member is None:
        return False
    member.left_at = utcnow()
    await session.flush()
    return True


async def next_in_turn(session: AsyncSession, story: Story) -> int | None:
    """Round robin: the character whose turn it is (after the last turn's player, by joining order)."""
    members = list(
        (
            await session.execute(
                select(StoryMember)
                .where(StoryMember.story_id == story.id, StoryMember.left_at.is_(None))
                .order_by(StoryMember.position)
            )
        ).scalars()
    )
    if not members:
        return None
    last = (
        await session.execute(
            select(Turn.character_id).where(Turn.story_id == story.id).order_by(Turn.seq.desc()).limit(1)
        )
    ).scalar_one_or_none()
    order = [m.character_id for m in members]
    if last not in order:
        return order[0]
    return order[(order.index(last) + 1) % len(order)]


async def played_lines(
    session: AsyncSession, guild_id: int, since: datetime, limit: int = 500
) -> list[tuple[str, int]]:
    """This server's instruction lines played since ``since`` and how often, most played first: what its
    autocomplete offers first (``game.suggestions.most_played``)."""
    times = func.count().label("times")
    rows = await session.execute(
        select(Turn.instruction, times)
        .join(Character, Turn.character_id == Character.id)
        .join(Player, Character.player_id == Player.id)
        .where(Player.guild_id == guild_id, Turn.created_at >= since)
        .group_by(Turn.instruction)
        .order_by(times.desc())
        .limit(limit)
    )
    return [(line, count) for line, count in rows]


async def get_app_state(session: AsyncSession, key: str) -> str | None:
    return (await session.execute(select(AppState.value).where(AppState.key == key))).scalar_one_or_none()


GAME_ID = "game_id"  # made by revision 0011


async def game_id(session: AsyncSession) -> str:
    """This game's id: every key the clip store holds for it starts with it (revision 0011 made it). A database
    made without the migrations (a test's ``create_all``) gets one the first time it is asked; two processes asking
    at once agree on the first one written."""
    found = await get_app_state(session, GAME_ID)
    if found is None:
        await insert_ignore(session, AppState, key=GAME_ID, value=f"g{secrets.token_hex(8)}")
        found = await get_app_state(session, GAME_ID)
        assert found is not None
    return found


RESULT_SECRET = "result_secret"


async def result_secret(session: AsyncSession) -> bytes:
    """The game's secret its turns' tickets are made with (game/proof.py): made the first time a bot asks, the same
    for every bot process of the game, and never sent to a worker (each turn's ticket is)."""
    found = await get_app_state(session, RESULT_SECRET)
    if found is None:
        await insert_ignore(session, AppState, key=RESULT_SECRET, value=secrets.token_hex(32))
        found = await get_app_state(session, RESULT_SECRET)
        assert found is not None
    return bytes.fromhex(found)


async def set_app_state(session: AsyncSession, key: str, value: str) -> None:
    """Insert or overwrite in one statement: two bots started together both write the commands' hash, and a
    SELECT-then-INSERT made one of them fail its start on the primary key (seen in CI on PostgreSQL)."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    upsert = dialect.insert(AppState).values(key=key, value=value)
    await session.execute(upsert.on_conflict_do_update(index_elements=["key"], set_={"value": value}))
