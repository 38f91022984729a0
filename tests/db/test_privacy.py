"""A user's data across every server: each column that holds a user id has a deletion rule, and deleting a user
leaves what the rule says, in every server, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import BigInteger, func, select

from db.base import utcnow
from db.jobs import create_turn
from db.models import Base, StoryProposal, StoryRound, StoryVote
from db.moderation import add_term, audit, ban
from db.privacy import USER_COLUMNS, Rule, collect, delete_user
from db.queries import create_story, get_or_create_character
from db.reports import DISMISSED, add_report, resolve_reports

ALICE, BOB = 5, 6
GUILDS = (100, 200)

# Every other 64-bit column: Discord ids of servers, channels and messages, and the turns' seeds.
NOT_USERS = {
    ("guilds", "id"),
    ("guild_settings", "guild_id"),
    ("allowed_channels", "guild_id"),
    ("allowed_channels", "channel_id"),
    ("audit_log", "guild_id"),
    ("bans", "guild_id"),
    ("blocked_terms", "guild_id"),
    ("players", "guild_id"),
    ("stories", "guild_id"),
    ("stories", "channel_id"),
    ("turns", "seed"),
    ("clip_reports", "guild_id"),
    ("jobs", "guild_id"),
    ("jobs", "channel_id"),
    ("jobs", "progress_message_id"),
    ("jobs", "result_message_id"),
    ("story_rounds", "message_id"),
    ("clip_copies", "guild_id"),
    ("clip_copies", "channel_id"),
    ("clip_copies", "message_id"),
}


def test_every_column_that_can_hold_a_user_id_has_a_deletion_rule() -> None:
    """A Discord id is 64 bits: a new such column is either a user's, with its rule in db/privacy.py, or named here."""
    wide = {
        (table.name, column.name)
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, BigInteger)
    }
    assert wide - NOT_USERS == set(USER_COLUMNS), "give each user id column a rule in db/privacy.py USER_COLUMNS"


async def seed(session, user_id: int, other: int, guilds: tuple[int, int] = GUILDS) -> None:
    """``user_id`` plays, starts a story, proposes and votes, reports ``other``'s clip, acts as an admin (dismisses
    reports, blocks a term), in both servers, bans ``other`` in the first and is banned in the second."""
    for guild_id in guilds:
        mine = await get_or_create_character(session, guild_id, user_id, "Qiqi")
        theirs = await get_or_create_character(session, guild_id, other, "Kiki")
        story = await create_story(session, guild_id, guild_id + 1, "Night flight", user_id)
        line = "Character: Qiqi; Motion: wave; Background: town."
        await create_turn(session, mine, line, 1, "tiny", story=story, guild_id=guild_id, user_id=user_id)
        other_turn, _ = await create_turn(session, theirs, line, 2, "tiny", guild_id=guild_id, user_id=other)
        await add_report(session, guild_id, other_turn.id, other)
        await resolve_reports(session, other_turn.id, DISMISSED, user_id)  # as the server's admin
        await add_report(session, guild_id, other_turn.id, user_id)
        round_ = StoryRound(story_id=story.id, number=1, closes_at=utcnow() + timedelta(minutes=5))
        session.add(round_)
        await session.flush()
        proposal = StoryProposal(round_id=round_.id, user_id=user_id, character_id=mine.id, instruction=line)
        session.add(proposal)
        await session.flush()
        session.add(StoryVote(round_id=round_.id, user_id=user_id, proposal_id=proposal.id))
        await add_term(session, guild_id, "goblin", user_id)
        await audit(session, guild_id, user_id, "terms add", "goblin")
    await ban(session, guilds[0], other, "spam", user_id)
    await ban(session, guilds[1], user_id, "spam", other)


async def holding(session, user_id: int) -> dict[tuple[str, str], int]:
    """How many rows hold ``user_id`` in each user column."""
    counts = {}
    for table_name, column_name in USER_COLUMNS:
        column = Base.metadata.tables[table_name].c[column_name]
        counts[(table_name, column_name)] = (
            await session.execute(select(func.count()).where(column == user_id))
        ).scalar_one()
    return counts


async def test_a_users_own_deletion_leaves_only_what_a_server_needs_against_abuse(sessions) -> None:
    async with sessions() as session, session.begin():
        await seed(session, ALICE, BOB)
    async with sessions() as session:
        before = await holding(session, ALICE)
        bob_before = await holding(session, BOB)
    assert all(before.values()), before  # the seed reaches every user column
    async with sessions() as session, session.begin():
        await delete_user(session, ALICE)
    async with sessions() as session:
        after = await holding(session, ALICE)
        stories = (await session.execute(select(func.count()).select_from(Base.metadata.tables["stories"]))).scalar()
        bob_after = await holding(session, BOB)
    for where, rule in USER_COLUMNS.items():
        assert after[where] == (before[where] if rule is Rule.KEPT_AGAINST_ABUSE else 0), where
    assert stories == len(GUILDS)  # the stories they started stay, for the others in them, unnamed
    assert bob_after == bob_before  # nothing of anyone else's goes


async def test_the_audit_log_keeps_what_was_done_to_a_deleted_users_turns_but_not_their_words(sessions) -> None:
    async with sessions() as session, session.begin():
        await seed(session, ALICE, BOB)
        jobs = Base.metadata.tables["jobs"].c
        mine = (await session.execute(select(jobs.id).where(jobs.user_id == ALICE).limit(1))).scalar_one()
        theirs = (await session.execute(select(jobs.id).where(jobs.user_id == BOB).limit(1))).scalar_one()
        for job_id in (mine, theirs):
            await audit(session, GUILDS[0], 0, "clip removed", f"job {job_id}", "1 open report(s); a secret wave")
    async with sessions() as session, session.begin():
        await delete_user(session, ALICE)
    log = Base.metadata.tables["audit_log"].c
    async with sessions() as session:
        rows = dict((await session.execute(select(log.target, log.details).where(log.action == "clip removed"))).all())
    assert rows == {f"job {mine}": None, f"job {theirs}": "1 open report(s); a secret wave"}


async def test_discords_deletion_of_an_account_leaves_nothing_of_it(sessions) -> None:
    async with sessions() as session, session.begin():
        await seed(session, ALICE, BOB)
        await seed(session, BOB, ALICE, guilds=(300, 400))  # and the same with their places swapped
    async with sessions() as session, session.begin():
        await delete_user(session, ALICE, whole=True)
    async with sessions() as session:
        assert not any((await holding(session, ALICE)).values())
        audit_targets = Base.metadata.tables["audit_log"].c.target
        assert not (await session.execute(select(func.count()).where(audit_targets == str(ALICE)))).scalar_one()


async def test_what_a_user_is_shown_is_theirs_from_every_server_and_nothing_of_anyone_elses(sessions) -> None:
    async with sessions() as session, session.begin():
        await seed(session, ALICE, BOB)
    async with sessions() as session:
        mine = await collect(session, ALICE)
    assert mine["servers"] == list(GUILDS)
    assert [c["name"] for c in mine["characters"]] == ["Qiqi", "Qiqi"]
    assert len(mine["turns"]) == 2 and len(mine["proposals"]) == 2 and len(mine["votes"]) == 2
    assert len(mine["reports_made"]) == 2 and [b["guild_id"] for b in mine["banned_in"]] == [GUILDS[1]]
    assert "Kiki" not in str(mine)
