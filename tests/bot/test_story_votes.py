"""Vote-order stories: the channel proposes the next turn, votes, and each round's winner is played once."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from db.base import utcnow
from db.engine import make_engine, make_sessionmaker
from db.models import Job, RoundStatus, StoryProposal, StoryRound, StoryVote, Turn
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.bot.helpers import private_text
from tests.discord_double import member

ALICE, BOB, CAROL = member("alice"), member("bob"), member("carol")
VOTERS = [member(f"voter{n}") for n in range(5)]
PROPOSALS = [  # who proposes what, as whom
    (ALICE, "Qiqi", "gently fly on broomstick", "night sky"),
    (BOB, "Sosuke", "quickly run", "day town"),
    (CAROL, "Momo", "gently wave", "day street"),
]
CLIP_POSTS = r"/channels/\d+/messages"


def line(player) -> str:
    _, name, motion, background = next(p for p in PROPOSALS if p[0] is player)
    return f"Character: {name}; Motion: {motion}; Background: {background}."


async def start_vote_story(double) -> None:
    opened = await (await double.slash("story start", {"title": "Crowd flight", "order": "vote"}, user=ALICE)).answer()
    assert "story propose" in (opened.json or {}).get("content", "")
    for player, name, _, _ in PROPOSALS:
        await (await double.slash("start", {"character": name}, user=player)).answer()


async def propose(double, player) -> str:
    _, _, motion, background = next(p for p in PROPOSALS if p[0] is player)
    handle = await double.slash("story propose", {"motion": motion, "background": background}, user=player)
    return private_text(await handle.answer())


async def round_message(double, proposals: int):
    """The bot's round message, once it lists ``proposals`` proposals with a button each."""

    def found():
        shown = [m for m in double.messages(double.guild.channel.id) if m.content.startswith("🗳️")]
        return next((m for m in shown if len(m.custom_ids()) == proposals), None)

    return await double.wait_until(found, timeout=15, what=f"a round message with {proposals} proposals")


async def vote(double, message, choice: int, voter) -> str:
    return private_text(await (await double.button(message, message.custom_ids()[choice], user=voter)).answer())


async def posted_story_turns(settings, count: int) -> None:
    """Wait until ``count`` story turns are made and posted."""
    await wait_for_db(
        settings,
        select(Job.result_message_id),
        lambda rows: sum(row[0] is not None for row in rows) == count,
        timeout=90,
    )


@pytest.mark.slow
async def test_a_round_of_three_proposals_and_five_voters_plays_the_winner_once_and_credits_it(
    double, worker_settings, sqlite_worker
):
    async with running_bot(double, worker_settings, sqlite_worker):
        await start_vote_story(double)
        for player, *_ in PROPOSALS:
            assert "Proposed for round 1" in await propose(double, player)
        message = await round_message(double, proposals=3)
        for voter in VOTERS[:3]:
            assert "Your vote is in" in await vote(double, message, 1, voter)  # Bob's run
        for voter in VOTERS[3:]:
            await vote(double, message, 0, voter)  # Alice's flight
        await vote(double, message, 0, VOTERS[2])  # changes their mind: 3 to 2 for the flight
        closed = private_text(await (await double.slash("story close", user=ALICE)).answer())
        await posted_story_turns(worker_settings, 1)
        await asyncio.sleep(2)  # more ticks of the round loop: nothing more may be played
        result = double.message(message.id)

    assert "Round 1 is closed" in closed
    turns = await read_db(worker_settings, select(Turn.seq, Turn.instruction).where(Turn.story_id.is_not(None)))
    assert turns == [(1, line(ALICE))]  # the winner, once
    (job,) = await read_db(worker_settings, select(Job.user_id, Job.kind))
    assert job == (None, "story")  # the channel's turn, not a player's: no one's quota or turn in flight
    voters = ", ".join(f"<@{v.id}>" for v in sorted(VOTERS[2:], key=lambda v: v.id))
    assert f"wins, proposed by <@{ALICE.id}>, chosen by {voters}." in result.content
    assert result.custom_ids() == []  # a closed round has no buttons
    votes = await read_db(worker_settings, select(StoryVote.user_id))
    assert len(votes) == 5  # one vote per member, the changed one replaced
    clip_posts = [m for m in double.messages() if any(a["filename"].endswith(".mp4") for a in m.attachments)]
    assert len(clip_posts) == 1


async def test_a_proposal_with_a_blocked_term_is_refused_privately_and_never_shown(double, bot_settings):
    moderator = member("mod", manage_guild=True)
    async with running_bot(double, bot_settings):
        await start_vote_story(double)
        await (await double.slash("admin terms add", {"term": "dragon"}, user=moderator)).answer()
        handle = await double.slash(
            "story propose", {"motion": "gently ride a dragon", "background": "night sky"}, user=ALICE
        )
        text = private_text(await handle.answer())
        await asyncio.sleep(1.5)  # a tick of the round loop
    assert "term this server blocks" in text
    assert await read_db(bot_settings, select(StoryProposal.id)) == []
    assert not [m for m in double.messages(double.guild.channel.id) if m.content.startswith("🗳️")]


async def test_a_winner_whose_term_was_blocked_after_it_was_proposed_is_not_played_and_the_round_closes(
    double, bot_settings
):
    """A vote's winner is made by the one function that makes every turn (bot/making.py), so its checks apply to it
    at the moment it is made: here the blocked terms, which /act checks too. Before, the round's own code made the
    winner with none of them, a term blocked during the vote included."""
    moderator = member("mod", manage_guild=True)
    async with running_bot(double, bot_settings):
        await start_vote_story(double)
        assert "Proposed for round 1" in await propose(double, ALICE)  # "gently fly on broomstick", in a "night sky"
        message = await round_message(double, proposals=1)
        await vote(double, message, 0, VOTERS[0])
        await (await double.slash("admin terms add", {"term": "broomstick"}, user=moderator)).answer()
        closed = private_text(await (await double.slash("story close", user=ALICE)).answer())
        await asyncio.sleep(1.5)  # a tick of the round loop: nothing is made later either
        rounds = await read_db(bot_settings, select(StoryRound.status, StoryRound.turn_id).order_by(StoryRound.id))
    assert "Round 1 is closed" in closed
    assert await read_db(bot_settings, select(Job.id)) == []  # no turn, no job
    assert rounds[0] == (RoundStatus.CLOSED, None)


async def test_act_in_a_vote_story_points_to_propose(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start_vote_story(double)
        handle = await double.slash("story act", {"motion": "quickly run", "background": "town"}, user=BOB)
        text = private_text(await handle.answer())
    assert "/story propose" in text


@pytest.mark.slow
async def test_a_round_open_across_a_bot_restart_closes_and_plays_once(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        await start_vote_story(double)
        await propose(double, ALICE)
        await propose(double, BOB)
        message = await round_message(double, proposals=2)
        await vote(double, message, 1, VOTERS[0])
    # The bot is down while the round's time runs out.
    engine = make_engine(worker_settings.database_url)
    async with make_sessionmaker(engine)() as session, session.begin():
        await session.execute(update(StoryRound).values(closes_at=utcnow() - timedelta(seconds=1)))
    await engine.dispose()

    async with running_bot(double, worker_settings, sqlite_worker):
        await posted_story_turns(worker_settings, 1)
        await asyncio.sleep(2)
        result = double.message(message.id)
    assert await read_db(worker_settings, select(Turn.instruction)) == [(line(BOB),)]
    assert f"wins, proposed by <@{BOB.id}>, chosen by <@{VOTERS[0].id}>." in result.content
    assert await read_db(worker_settings, select(StoryRound.status, StoryRound.announced)) == [("closed", True)]


async def test_purging_a_member_deletes_their_votes_and_proposals(double, bot_settings):
    moderator = member("mod", manage_guild=True)
    async with running_bot(double, bot_settings):
        await start_vote_story(double)
        await propose(double, ALICE)
        await propose(double, BOB)
        message = await round_message(double, proposals=2)
        await vote(double, message, 0, BOB)
        await vote(double, message, 1, VOTERS[0])
        await (await double.slash("admin purge", {"user": BOB}, user=moderator)).answer()
    assert await read_db(bot_settings, select(StoryProposal.instruction)) == [(line(ALICE),)]
    assert await read_db(bot_settings, select(StoryVote.user_id)) == []  # Bob's own, and the one for his proposal


async def test_a_round_message_discord_refuses_at_first_is_posted_on_a_later_tick(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start_vote_story(double)
        refused = double.fail("POST", CLIP_POSTS, status=403, code=50013, times=2)  # the channel refuses twice
        assert "Proposed for round 1" in await propose(double, ALICE)
        message = await round_message(double, proposals=1)
    assert refused.hits == 2  # both refusals were met, and the round was shown after them
    assert line(ALICE) in message.content
