"""/admin: every command works for a member with Manage Server and is refused, changing nothing, for one without.

Discord hides /admin from members without Manage Server (``default_permissions``), but a server owner can
override that; the double lets any member invoke any command, which is exactly that override, so the check
in code is what the refused tests exercise. Every admin action writes an audit row (who, what, when).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from bot.retention import retention_text
from db import moderation, reports
from db.base import utcnow
from db.models import AuditLog, Ban, BlockedTerm, Character, GuildSettings, Job, JobStatus, Player, Turn
from tests.bot.conftest import read_db, running_bot
from tests.bot.helpers import (
    accepted,
    clip_path,
    db_session,
    idle_queue,
    private_text,
    refusal,
    running_bot_on,
    seed_turn,
    snapshot,
)
from tests.discord_double import MANAGE_GUILD, Channel, DiscordDouble, Guild, member

MOD = member("mod", manage_guild=True)
HELPER = member("helper")  # no Manage Server: invoking /admin as them is an owner's override of the default
ROOT = member("root", administrator=True)
ALICE = member("alice")
BOB = member("bob")
CHANNEL = object()  # stands for the guild's channel, which only exists once the double does

# Every /admin subcommand, options that make it act, and the audit action it records (None: it only reads).
ADMIN_COMMANDS = [
    ("ban", {"user": ALICE, "reason": "spam"}, "ban"),
    ("unban", {"user": ALICE}, "unban"),
    ("terms add", {"term": "dragon"}, "terms add"),
    ("terms remove", {"term": "goblin"}, "terms remove"),
    ("terms list", {}, None),
    ("channels allow", {"channel": CHANNEL}, "channels allow"),
    ("channels deny", {"channel": CHANNEL}, "channels deny"),
    ("channels list", {}, None),
    ("quota", {"turns_per_hour": 5, "max_queued": 3}, "quota"),
    ("history", {"window": 3}, "history"),
    ("pause", {}, "pause"),
    ("resume", {}, "resume"),
    ("purge", {"user": ALICE}, "purge"),
    ("safety", {"policy": "age_restricted", "threshold": 0.6}, "safety"),
    ("reports list", {}, None),
    ("reports remove", {"job": 1}, "clip removed"),  # Alice's turn, which Bob reported (``prepare``)
    ("reports dismiss", {"job": 1}, "reports dismissed"),
    ("audit", {}, None),
    ("stats", {}, None),
]


def _options(options: dict, guild: Guild) -> dict:
    return {name: guild.channel if value is CHANNEL else value for name, value in options.items()}


async def prepare(settings, guild: Guild, *, paused: bool) -> int:
    """A server where each admin command has something to act on; returns Alice's finished turn's job id."""
    job_id = await seed_turn(settings, guild.id, guild.channel.id, ALICE.id, done=True)
    async with db_session(settings) as session:
        (turn_id,) = (await session.execute(select(Job.turn_id).where(Job.id == job_id))).one()
        await reports.add_report(session, guild.id, turn_id, BOB.id)
        await moderation.ban(session, guild.id, ALICE.id, "earlier", MOD.id)
        await moderation.add_term(session, guild.id, "goblin", MOD.id)
        await moderation.allow_channel(session, guild.id, guild.channel.id)
        await moderation.set_paused(session, guild.id, paused)
    return job_id


async def admin(double, command: str, options: dict | None = None, user=MOD) -> str:
    handle = await double.slash(f"admin {command}", options or {}, user=user)
    return private_text(await handle.answer())


# -- who may use /admin ---------------------------------------------------------------------------------


async def test_admin_is_hidden_by_default_from_members_without_manage_server(double, bot_settings):
    async with running_bot(double, bot_settings):
        (schema,) = [c for c in double.commands[None] if c["name"] == "admin"]
    assert int(schema["default_member_permissions"]) == MANAGE_GUILD
    assert schema["contexts"] == [0]  # servers only, never DMs


@pytest.mark.parametrize(("command", "options", "action"), ADMIN_COMMANDS, ids=[c[0] for c in ADMIN_COMMANDS])
async def test_admin_command_is_refused_without_manage_server_and_changes_nothing(
    double, bot_settings, command, options, action
):
    guild = double.guild
    async with running_bot(double, bot_settings):
        job_id = await prepare(bot_settings, guild, paused=command == "resume")
        before = await snapshot(bot_settings)
        handle = await double.slash(f"admin {command}", _options(options, guild), user=HELPER)
        refusal(await handle.answer(), "Manage Server")
    assert await snapshot(bot_settings) == before
    assert clip_path(bot_settings, guild.id, job_id).exists()


@pytest.mark.parametrize(("command", "options", "action"), ADMIN_COMMANDS, ids=[c[0] for c in ADMIN_COMMANDS])
async def test_admin_command_works_with_manage_server_and_audits_what_it_changed(
    double, bot_settings, command, options, action
):
    guild = double.guild
    async with running_bot(double, bot_settings):
        await prepare(bot_settings, guild, paused=command == "resume")
        text = await admin(double, command, _options(options, guild))
    assert "Manage Server" not in text
    audit = await read_db(bot_settings, select(AuditLog.actor_id, AuditLog.action, AuditLog.created_at))
    if action is None:
        assert audit == []
    else:
        ((actor, done, when),) = audit
        assert (actor, done) == (MOD.id, action)
        assert utcnow() - when < timedelta(minutes=1)


async def test_an_administrator_without_manage_server_may_use_admin(double, bot_settings):
    async with running_bot(double, bot_settings):
        text = await admin(double, "pause", user=ROOT)
    assert text == "Generation is paused."


# -- ban and unban --------------------------------------------------------------------------------------


async def test_ban_of_a_banned_member_updates_the_reason(double, bot_settings):
    async with running_bot(double, bot_settings):
        await admin(double, "ban", {"user": ALICE, "reason": "spam"})
        text = await admin(double, "ban", {"user": ALICE, "reason": "still spamming"})
    assert "already banned" in text
    assert await read_db(bot_settings, select(Ban.user_id, Ban.reason)) == [(ALICE.id, "still spamming")]


async def test_unban_lets_the_member_play_again(double, bot_settings, tmp_path):
    async with running_bot_on(double, bot_settings, idle_queue(bot_settings, tmp_path)):
        await admin(double, "ban", {"user": ALICE})
        assert await admin(double, "unban", {"user": ALICE}) == f"<@{ALICE.id}> may play again."
        await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
        act = await double.slash("act", {"motion": "wave", "background": "town"}, user=ALICE)
        await accepted(act)  # accepted and queued
    assert await read_db(bot_settings, select(Ban.id)) == []


async def test_unban_of_a_member_who_is_not_banned_is_refused(double, bot_settings):
    async with running_bot(double, bot_settings):
        handle = await double.slash("admin unban", {"user": BOB}, user=MOD)
        refusal(await handle.answer(), "is not banned")
    assert await read_db(bot_settings, select(AuditLog.id)) == []


# -- blocked terms --------------------------------------------------------------------------------------


async def test_terms_are_stored_in_lower_case_with_single_spaces_and_listed(double, bot_settings):
    async with running_bot(double, bot_settings):
        await admin(double, "terms add", {"term": "  Night   SKY "})
        await admin(double, "terms add", {"term": "Dragon"})
        text = await admin(double, "terms list")
    assert text == "`dragon`, `night sky`"


async def test_terms_add_twice_says_it_was_already_blocked(double, bot_settings):
    async with running_bot(double, bot_settings):
        await admin(double, "terms add", {"term": "dragon"})
        text = await admin(double, "terms add", {"term": "DRAGON"})
    assert text == "That term was already blocked."
    assert await read_db(bot_settings, select(BlockedTerm.term)) == [("dragon",)]


async def test_terms_add_of_only_spaces_is_refused_instead_of_blocking_everything(double, bot_settings):
    async with running_bot(double, bot_settings):
        handle = await double.slash("admin terms add", {"term": "   "}, user=MOD)
        refusal(await handle.answer(), "blocked term", "empty")
    assert await read_db(bot_settings, select(BlockedTerm.id)) == []


async def test_terms_remove_matches_ignoring_case_and_spacing(double, bot_settings):
    async with running_bot(double, bot_settings):
        await admin(double, "terms add", {"term": "night sky"})
        assert await admin(double, "terms remove", {"term": " NIGHT  sky"}) == "Unblocked."
    assert await read_db(bot_settings, select(BlockedTerm.id)) == []


async def test_terms_remove_of_a_term_not_blocked_is_refused(double, bot_settings):
    async with running_bot(double, bot_settings):
        handle = await double.slash("admin terms remove", {"term": "dragon"}, user=MOD)
        refusal(await handle.answer(), "not blocked", "/admin terms list")


# -- channels -------------------------------------------------------------------------------------------


async def test_channels_list_says_every_channel_while_none_is_listed(double, bot_settings):
    async with running_bot(double, bot_settings):
        assert await admin(double, "channels list") == "Every channel (none is listed)."


async def test_channels_allow_lists_the_channel(bot_settings):
    play = Channel("play")
    guild = Guild(channels=[Channel("general"), play])
    async with DiscordDouble([guild]) as double, running_bot(double, bot_settings):
        await admin(double, "channels allow", {"channel": play})
        assert await admin(double, "channels list") == f"<#{play.id}>"


async def test_channels_deny_of_the_last_listed_channel_opens_every_channel(double, bot_settings):
    channel = double.guild.channel
    async with running_bot(double, bot_settings):
        await admin(double, "channels allow", {"channel": channel})
        text = await admin(double, "channels deny", {"channel": channel})
        assert "everywhere" in text
        assert await admin(double, "channels list") == "Every channel (none is listed)."


async def test_channels_deny_of_a_channel_not_listed_is_refused(double, bot_settings):
    async with running_bot(double, bot_settings):
        handle = await double.slash("admin channels deny", {"channel": double.guild.channel}, user=MOD)
        refusal(await handle.answer(), "not on the allowed list")


# -- quota, pause, resume -------------------------------------------------------------------------------


async def test_quota_without_options_shows_the_limits_and_audits_nothing(double, bot_settings):
    async with running_bot(double, bot_settings):
        text = await admin(double, "quota")
    assert text == "20 turns per player per hour; at most 10 turns in flight on this server."
    assert await read_db(bot_settings, select(AuditLog.id)) == []


async def test_quota_sets_either_limit_alone(double, bot_settings):
    async with running_bot(double, bot_settings):
        await admin(double, "quota", {"turns_per_hour": 3})
        text = await admin(double, "quota", {"max_queued": 4})
    assert text.startswith("3 turns per player per hour; at most 4 turns")
    limits = await read_db(bot_settings, select(GuildSettings.turns_per_hour, GuildSettings.max_queued_turns))
    assert limits == [(3, 4)]


async def test_history_without_a_window_shows_it_and_audits_nothing(double, bot_settings):
    async with running_bot(double, bot_settings):
        text = await admin(double, "history")
    assert text == "Each turn is made with no past turns."
    assert await read_db(bot_settings, select(AuditLog.id)) == []


async def test_history_sets_the_servers_window(double, bot_settings):
    async with running_bot(double, bot_settings):
        text = await admin(double, "history", {"window": 3})
    assert text == "Each turn is made with the 2 turns before it."
    assert await read_db(bot_settings, select(GuildSettings.history_window)) == [(3,)]
    assert await read_db(bot_settings, select(AuditLog.action, AuditLog.details)) == [("history", "3")]


async def test_pause_twice_says_it_already_was_and_audits_once(double, bot_settings):
    async with running_bot(double, bot_settings):
        await admin(double, "pause")
        assert await admin(double, "pause") == "Generation was already paused."
    assert await read_db(bot_settings, select(AuditLog.action)) == [("pause",)]


async def test_resume_lets_play_again(double, bot_settings, tmp_path):
    async with running_bot_on(double, bot_settings, idle_queue(bot_settings, tmp_path)):
        await admin(double, "pause")
        assert await admin(double, "resume") == "Generation is running."
        await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
        act = await double.slash("act", {"motion": "wave", "background": "town"}, user=ALICE)
        await accepted(act)
    assert await read_db(bot_settings, select(GuildSettings.paused)) == [(False,)]


# -- purge, audit, stats --------------------------------------------------------------------------------


async def test_purge_deletes_the_members_characters_turns_jobs_and_clips_and_nobody_elses(double, bot_settings):
    guild = double.guild
    async with running_bot(double, bot_settings):
        alices = [await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, done=True)]
        alices.append(await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, character="Sosuke"))
        bobs = await seed_turn(bot_settings, guild.id, guild.channel.id, BOB.id, done=True)
        text = await admin(double, "purge", {"user": ALICE})
    assert "1 clip file" in text
    assert not clip_path(bot_settings, guild.id, alices[0]).exists()
    assert clip_path(bot_settings, guild.id, bobs).exists()
    assert await read_db(bot_settings, select(Player.user_id)) == [(BOB.id,)]
    assert await read_db(bot_settings, select(Character.name)) == [("Qiqi",)]
    assert await read_db(bot_settings, select(Job.id)) == [(bobs,)]
    assert len(await read_db(bot_settings, select(Turn.id))) == 1


async def test_audit_shows_who_did_what_and_when_newest_first(double, bot_settings):
    async with running_bot(double, bot_settings):
        await admin(double, "ban", {"user": ALICE, "reason": "**spam**"})
        await admin(double, "terms add", {"term": "dragon"})
        text = await admin(double, "audit")
    newest, oldest = text.split("\n")
    assert newest.endswith(f"<@{MOD.id}> terms add dragon")
    assert oldest.endswith(f"<@{MOD.id}> ban <@{ALICE.id}> (\\*\\*spam\\*\\*)")  # the reason's markdown is escaped
    assert newest.startswith("<t:") and newest.split(" ")[0].endswith(":f>")


async def test_audit_of_a_server_with_no_actions_says_so(double, bot_settings):
    async with running_bot(double, bot_settings):
        assert await admin(double, "audit") == "No admin actions yet."


async def test_stats_counts_players_turns_today_the_queue_and_the_average_turn_time(double, bot_settings):
    guild = double.guild
    async with running_bot(double, bot_settings):
        await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, done=True)
        await seed_turn(bot_settings, guild.id, guild.channel.id, BOB.id)
        async with db_session(bot_settings) as session:  # the finished turn took 30 s from queued to done
            job = (await session.execute(select(Job).where(Job.status == JobStatus.DONE))).scalar_one()
            job.finished_at = job.queued_at + timedelta(seconds=30)
        text = await admin(double, "stats")
    assert text.split("\n") == [
        "Players: 2",
        "Turns in the last 24 h: 2",
        "In flight now: 1",
        "Average turn (queued to done): 30.0 s",
        retention_text(bot_settings) + ".",
    ]
