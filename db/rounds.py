"""Vote rounds of a vote-order story: proposals, votes, and closing a round exactly once.

A round opens with its first proposal and stays open until ``closes_at``; members vote once each and may
change their vote until then. Closing is one UPDATE guarded by the round's status, so of two bots (or a
bot and its restarted self) closing the same round, one does and the other is told it was closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from db.models import RoundStatus, Story, StoryProposal, StoryRound, StoryStatus, StoryVote
from game.votes import tally, winner


@dataclass(frozen=True)
class Standing:
    """A round as its message shows it: each proposal in order, with its votes."""

    round: StoryRound
    story: Story
    proposals: list[tuple[StoryProposal, int]]

    @property
    def winner(self) -> StoryProposal | None:
        return next((proposal for proposal, _ in self.proposals if proposal.id == self.round.winner_id), None)


async def open_round(session: AsyncSession, story_id: int) -> StoryRound | None:
    return (
        await session.execute(
            select(StoryRound).where(StoryRound.story_id == story_id, StoryRound.status == RoundStatus.OPEN)
        )
    ).scalar_one_or_none()


async def round_for_proposal(session: AsyncSession, story: Story, now: datetime) -> tuple[StoryRound, bool]:
    """The story's open round, or a new one closing ``story.round_seconds`` from ``now``; and whether it is new."""
    found = await open_round(session, story.id)
    if found is not None:
        return found, False
    last = (
        await session.execute(select(func.max(StoryRound.number)).where(StoryRound.story_id == story.id))
    ).scalar_one()
    opened = StoryRound(
        story_id=story.id, number=(last or 0) + 1, closes_at=now + timedelta(seconds=story.round_seconds or 0)
    )
    session.add(opened)
    await session.flush()  # two proposals opening a round at once: the one-open-round index refuses the second
    return opened, True


async def proposals_in(session: AsyncSession, round_id: int) -> int:
    return (await session.execute(select(func.count()).where(StoryProposal.round_id == round_id))).scalar_one()


async def cast_vote(session: AsyncSession, guild_id: int, round_id: int, proposal_id: int, user_id: int) -> bool:
    """Record (or change) ``user_id``'s vote; False when the round is no longer open, or the proposal is not in it,
    or the round is another server's."""
    valid = (
        await session.execute(
            select(StoryProposal.id)
            .join(StoryRound, StoryRound.id == StoryProposal.round_id)
            .join(Story, Story.id == StoryRound.story_id)
            .where(
                StoryProposal.id == proposal_id,
                StoryRound.id == round_id,
                StoryRound.status == RoundStatus.OPEN,
                Story.guild_id == guild_id,
            )
        )
    ).scalar_one_or_none()
    if valid is None:
        return False
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    upsert = dialect.insert(StoryVote).values(round_id=round_id, user_id=user_id, proposal_id=proposal_id)
    await session.execute(
        upsert.on_conflict_do_update(index_elements=["round_id", "user_id"], set_={"proposal_id": proposal_id})
    )
    return True


async def standing(session: AsyncSession, round_id: int) -> Standing | None:
    found = await session.get(StoryRound, round_id)
    if found is None:
        return None
    story = await session.get(Story, found.story_id)
    assert story is not None, "a round's story is deleted with it"
    proposals = list(
        (
            await session.execute(
                select(StoryProposal).where(StoryProposal.round_id == round_id).order_by(StoryProposal.id)
            )
        ).scalars()
    )
    votes = (await session.execute(select(StoryVote.proposal_id).where(StoryVote.round_id == round_id))).scalars()
    counts = dict(tally([p.id for p in proposals], votes))
    return Standing(found, story, [(proposal, counts[proposal.id]) for proposal in proposals])


async def voters_for(session: AsyncSession, proposal_id: int) -> list[int]:
    return list(
        (
            await session.execute(
                select(StoryVote.user_id).where(StoryVote.proposal_id == proposal_id).order_by(StoryVote.user_id)
            )
        ).scalars()
    )


async def due_rounds(session: AsyncSession, now: datetime) -> list[int]:
    """Open rounds whose time is up, and closed ones whose result was never shown (the bot stopped between)."""
    due = StoryRound.status == RoundStatus.OPEN, StoryRound.closes_at <= now
    closing = (await session.execute(select(StoryRound.id).where(*due).order_by(StoryRound.id))).scalars()
    unshown = StoryRound.status == RoundStatus.CLOSED, StoryRound.announced.is_(False)
    shown = (await session.execute(select(StoryRound.id).where(*unshown).order_by(StoryRound.id))).scalars()
    return sorted({*closing, *shown})


async def unposted_rounds(session: AsyncSession) -> list[int]:
    """Open rounds whose message was never posted (the post failed, or the bot stopped before it)."""
    unposted = StoryRound.status == RoundStatus.OPEN, StoryRound.message_id.is_(None)
    return list((await session.execute(select(StoryRound.id).where(*unposted))).scalars())


async def close_round(session: AsyncSession, round_id: int) -> Standing | None:
    """Close an open round and choose its winner (``round.winner_id``; none when nothing can be played: no
    proposals left, or the story ended). None when the round was not open: another closer was first."""
    closed = await session.execute(
        update(StoryRound)
        .where(StoryRound.id == round_id, StoryRound.status == RoundStatus.OPEN)
        .values(status=RoundStatus.CLOSED)
    )
    if closed.rowcount != 1:
        return None
    result = await standing(session, round_id)
    assert result is not None
    await session.refresh(result.round)
    if result.story.status == StoryStatus.ACTIVE:
        result.round.winner_id = winner([(proposal.id, votes) for proposal, votes in result.proposals])
    return result


async def close_now(session: AsyncSession, story_id: int, now: datetime) -> StoryRound | None:
    """Make the story's open round due now (its creator closing it early); the closer does the rest."""
    found = await open_round(session, story_id)
    if found is not None:
        found.closes_at = now
    return found
