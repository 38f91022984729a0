"""What the game keeps about one Discord user, across every server, and how each piece goes when they ask.

Every column that holds a user's id has a rule here (``USER_COLUMNS``; tests/db/test_privacy.py fails on a column
without one). Three ways a user's data is deleted, as Red-DiscordBot separates them:

- the user's own request (``/mydata delete``): everything of theirs goes, except what a server needs against abuse,
  kept as bare ids (a ban on them, the audit rows of what they did as an admin);
- an admin's purge (``/admin purge``): one server's characters, turns and clips (db/moderation.py);
- Discord's request for a deleted account (``animegamer privacy delete-user``): everything, bans and audit included.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from db import moderation
from db.jobs import status_in
from db.models import (
    AuditLog,
    Ban,
    BlockedTerm,
    Character,
    ClipReport,
    Job,
    Player,
    Story,
    StoryProposal,
    StoryVote,
    Turn,
)
from game.jobs import IN_FLIGHT

GONE = 0  # the id written where a row is kept without its user


class Rule(enum.Enum):
    DELETED = "deleted"
    UNNAMED = "kept, the id replaced by 0"  # shared content others built on: a story they started
    KEPT_AGAINST_ABUSE = "kept as a bare id on the user's own request; deleted on Discord's"


# (table, column) -> what a deletion does with it.
USER_COLUMNS: dict[tuple[str, str], Rule] = {
    ("players", "user_id"): Rule.DELETED,  # with their characters, turns, story places, proposals and clips
    ("jobs", "user_id"): Rule.DELETED,
    ("story_proposals", "user_id"): Rule.DELETED,
    ("story_votes", "user_id"): Rule.DELETED,
    ("clip_reports", "reporter_id"): Rule.DELETED,
    ("stories", "created_by"): Rule.UNNAMED,
    ("bans", "user_id"): Rule.KEPT_AGAINST_ABUSE,
    ("bans", "banned_by"): Rule.KEPT_AGAINST_ABUSE,
    ("blocked_terms", "added_by"): Rule.KEPT_AGAINST_ABUSE,
    ("audit_log", "actor_id"): Rule.KEPT_AGAINST_ABUSE,
    ("clip_reports", "resolved_by"): Rule.KEPT_AGAINST_ABUSE,
}


@dataclass
class Deleted:
    clip_keys: list[str] = field(default_factory=list)  # owed to the store (db/clip_deletes.py)
    copies: int = 0  # posted recaps and pages withdrawn (db/clip_copies.py)
    task_ids: list[str] = field(default_factory=list)  # turns sent to the workers and not finished: to cancel
    stories: list[int] = field(default_factory=list)  # stories their turns were in: their kept recaps go
    rows: int = 0


async def delete_user(session: AsyncSession, user_id: int, *, whole: bool = False) -> Deleted:
    """Delete what the game keeps about ``user_id`` in every server (``whole``: the bans on them and their ids in the
    audit log too), in the caller's transaction."""
    done = Deleted()
    done.task_ids = [
        task_id
        for (task_id,) in await session.execute(
            select(Job.task_id).where(Job.user_id == user_id, status_in(*IN_FLIGHT), Job.sent_at.is_not(None))
        )
    ]
    # What the audit log says of their turns (a removed clip's instruction, why a clip was withheld) is their words:
    # the record of what was done stays, against abuse, without them.
    jobs = [
        f"job {job_id}" for job_id in (await session.execute(select(Job.id).where(Job.user_id == user_id))).scalars()
    ]
    if jobs:
        said = update(AuditLog).where(AuditLog.target.in_(jobs), AuditLog.details.is_not(None)).values(details=None)
        done.rows += (await session.execute(said)).rowcount or 0
    guilds = (await session.execute(select(Player.guild_id).where(Player.user_id == user_id))).scalars().all()
    for guild_id in guilds:
        done.stories += await moderation.stories_of_player(session, guild_id, user_id)
        keys, copies = await moderation.purge_player(session, guild_id, user_id)
        done.clip_keys += keys
        done.copies += copies
        done.rows += 1
    for stmt in (
        delete(StoryVote).where(StoryVote.user_id == user_id),
        delete(StoryProposal).where(StoryProposal.user_id == user_id),
        delete(ClipReport).where(ClipReport.reporter_id == user_id),
        delete(Job).where(Job.user_id == user_id),
        update(Story).where(Story.created_by == user_id).values(created_by=GONE),
    ):
        done.rows += (await session.execute(stmt)).rowcount or 0
    if whole:
        for stmt in (
            delete(Ban).where(Ban.user_id == user_id),
            update(Ban).where(Ban.banned_by == user_id).values(banned_by=GONE),
            update(BlockedTerm).where(BlockedTerm.added_by == user_id).values(added_by=GONE),
            update(AuditLog).where(AuditLog.actor_id == user_id).values(actor_id=GONE),
            update(AuditLog).where(AuditLog.target == str(user_id)).values(target=str(GONE)),  # bans, purges
            update(ClipReport).where(ClipReport.resolved_by == user_id).values(resolved_by=GONE),
        ):
            done.rows += (await session.execute(stmt)).rowcount or 0
    return done


async def collect(session: AsyncSession, user_id: int) -> dict[str, Any]:
    """Everything the game keeps about ``user_id``, across every server, as JSON-ready data (``/mydata``)."""
    players = (await session.execute(select(Player).where(Player.user_id == user_id))).scalars().all()
    characters: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for player in players:
        for character in (
            await session.execute(select(Character).where(Character.player_id == player.id).order_by(Character.id))
        ).scalars():
            characters.append(
                {
                    "server": player.guild_id,
                    "name": character.name,
                    "stamina": character.stamina,
                    "social": character.social,
                    "entertainment": character.entertainment,
                    "active": character.is_active,
                    "created_at": character.created_at.isoformat(),
                }
            )
            for turn in (
                await session.execute(select(Turn).where(Turn.character_id == character.id).order_by(Turn.id))
            ).scalars():
                turns.append(
                    {
                        "server": player.guild_id,
                        "character": character.name,
                        "story": turn.story_id,
                        "instruction": turn.instruction,
                        "seed": turn.seed,
                        "after": [turn.stamina_after, turn.social_after, turn.entertainment_after],
                        "clip_key": turn.clip_key,
                        "created_at": turn.created_at.isoformat(),
                    }
                )

    async def rows(stmt) -> list[dict[str, Any]]:
        return [dict(row._mapping) for row in await session.execute(stmt)]

    def iso(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in item.items()} for item in items]

    return {
        "user_id": user_id,
        "servers": sorted(player.guild_id for player in players),
        "characters": characters,
        "turns": turns,
        "stories_started": iso(
            await rows(select(Story.id, Story.guild_id, Story.title).where(Story.created_by == user_id))
        ),
        "proposals": iso(
            await rows(
                select(StoryProposal.round_id, StoryProposal.instruction, StoryProposal.created_at).where(
                    StoryProposal.user_id == user_id
                )
            )
        ),
        "votes": iso(await rows(select(StoryVote.round_id, StoryVote.proposal_id).where(StoryVote.user_id == user_id))),
        "reports_made": iso(
            await rows(
                select(ClipReport.guild_id, ClipReport.turn_id, ClipReport.created_at).where(
                    ClipReport.reporter_id == user_id
                )
            )
        ),
        "banned_in": iso(await rows(select(Ban.guild_id, Ban.reason, Ban.created_at).where(Ban.user_id == user_id))),
        "admin_actions": iso(
            await rows(
                select(AuditLog.guild_id, AuditLog.action, AuditLog.created_at).where(AuditLog.actor_id == user_id)
            )
        ),
    }
