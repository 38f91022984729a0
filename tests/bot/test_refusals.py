"""Every refusal a turn can meet: one short private sentence that says why and what to do, and no turn on record.

The real bot against the loopback Discord. Turns that must stay in flight go to a real Celery queue that no
worker consumes (``idle_queue``), or are written through ``db.queries``; the unreachable queue is a Celery app
pointed at a port where nothing listens.
"""

from __future__ import annotations

from sqlalchemy import select

from db.models import Job, JobStatus
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.bot.helpers import (
    accepted,
    dead_queue,
    idle_queue,
    private_text,
    refusal,
    running_bot_on,
    seed_turn,
    turns_and_jobs,
)
from tests.discord_double import Channel, DiscordDouble, Guild, member

ALICE = member("alice")
BOB = member("bob")
MOD = member("mod", manage_guild=True)
FLY = {"motion": "gently fly on broomstick", "background": "night sky"}


async def start(double, user=ALICE) -> None:
    handle = await double.slash("start", {"character": "Qiqi"}, user=user)
    assert "You play" in private_text(await handle.answer())


async def admin(double, command: str, options: dict | None = None) -> str:
    handle = await double.slash(f"admin {command}", options or {}, user=MOD)
    return private_text(await handle.answer())


async def act(double, user=ALICE, **options):
    return await double.slash("act", options or FLY, user=user)


async def test_a_banned_member_is_told_so_with_the_reason_and_nobody_is_pinged(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start(double)
        await admin(double, "ban", {"user": ALICE, "reason": "spamming @everyone"})
        handle = await act(double)
        refusal(await handle.answer(), "banned", "spamming @everyone")  # refusal() checks allowed_mentions
    assert await turns_and_jobs(bot_settings) == (0, 0)


async def test_a_blocked_term_is_refused_ignoring_case_without_repeating_it(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start(double)
        await admin(double, "terms add", {"term": "BroomStick"})
        handle = await act(double, motion="gently fly on bROOMstick", background="night sky")
        text = refusal(await handle.answer(), "blocks", "rephrase")
    assert "broomstick" not in text.casefold()
    assert await turns_and_jobs(bot_settings) == (0, 0)


async def test_a_blocked_term_is_checked_on_a_whole_instruction_line_too(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start(double)
        await admin(double, "terms add", {"term": "night sky"})
        line = "Character: Qiqi; Motion: gently fly on broomstick; Background: NIGHT   sky"
        handle = await act(double, instruction=line)
        refusal(await handle.answer(), "blocks")
    assert await turns_and_jobs(bot_settings) == (0, 0)


async def test_a_blocked_term_that_is_also_a_label_of_the_grammar_does_not_block_every_turn(bot_settings, tmp_path):
    # The labels "Character:", "Motion:" and "Background:" are ours, not the player's words.
    async with DiscordDouble() as double, running_bot_on(double, bot_settings, idle_queue(bot_settings, tmp_path)):
        await start(double)
        await admin(double, "terms add", {"term": "motion"})
        handle = await act(double)
        await accepted(handle)
    assert await turns_and_jobs(bot_settings) == (1, 1)


async def test_play_in_a_channel_not_allowed_names_the_channels_that_are(bot_settings):
    play = Channel("play")
    guild = Guild(channels=[Channel("general"), play])
    async with DiscordDouble([guild]) as double, running_bot(double, bot_settings):
        await start(double)
        await admin(double, "channels allow", {"channel": play})
        handle = await act(double)  # in #general
        refusal(await handle.answer(), "not played in this channel", f"<#{play.id}>")
    assert await turns_and_jobs(bot_settings) == (0, 0)


async def test_the_hourly_quota_says_when_it_resets(double, bot_settings):
    guild = double.guild
    async with running_bot(double, bot_settings):
        await start(double)
        await admin(double, "quota", {"turns_per_hour": 1})
        await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, done=True)
        ((queued_at,),) = await read_db(bot_settings, select(Job.queued_at))
        handle = await act(double)
        refusal(await handle.answer(), "1 turn per hour", f"<t:{int(queued_at.timestamp()) + 3600}:R>")
    assert await turns_and_jobs(bot_settings) == (1, 1)


async def test_a_quota_of_zero_says_play_is_switched_off_not_when_it_resets(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start(double)
        await admin(double, "quota", {"turns_per_hour": 0})
        handle = await act(double)
        text = refusal(await handle.answer(), "switched off", "/admin quota")
    assert "<t:" not in text
    assert await turns_and_jobs(bot_settings) == (0, 0)


async def test_a_second_act_while_the_first_is_in_flight_is_refused(bot_settings, tmp_path):
    async with DiscordDouble() as double, running_bot_on(double, bot_settings, idle_queue(bot_settings, tmp_path)):
        await start(double)
        first = await act(double)
        await accepted(first)
        # The first turn was sent for real: its progress message is on record and it stays queued.
        await wait_for_db(bot_settings, select(Job.progress_message_id), lambda rows: rows and rows[0][0])
        second = await act(double, motion="slowly walk", background="town")
        refusal(await second.answer(), "still being made", "/cancel")
    assert await turns_and_jobs(bot_settings) == (1, 1)


async def test_a_full_server_queue_is_refused_with_its_size(double, bot_settings):
    guild = double.guild
    async with running_bot(double, bot_settings):
        await start(double)
        await admin(double, "quota", {"max_queued": 1})
        await seed_turn(bot_settings, guild.id, guild.channel.id, BOB.id)  # Bob's turn fills the server's queue
        handle = await act(double)
        refusal(await handle.answer(), "queue is full", "1 turn", "try again")
    assert await turns_and_jobs(bot_settings) == (1, 1)


async def test_paused_generation_is_refused(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start(double)
        await admin(double, "pause")
        handle = await act(double)
        refusal(await handle.answer(), "paused")
    assert await turns_and_jobs(bot_settings) == (0, 0)


async def test_a_turn_taken_while_the_queue_is_down_waits_for_it_then_expires_with_a_message(double, bot_settings):
    settings = bot_settings.model_copy(update={"pickup_timeout": 2.0})
    async with running_bot_on(double, settings, dead_queue(settings)):
        await start(double)
        handle = await act(double)
        await accepted(handle)  # answered within the deadline, then the send failed
        await handle.answer()
        await double.wait_until(lambda: "not answering" in handle.original.content, 15, "the queue-down note")
        await wait_for_db(settings, select(Job.status), lambda rows: rows == [(JobStatus.EXPIRED,)])
        await double.wait_until(lambda: "No worker picked up" in handle.original.content, 15, "the expiry notice")
    ((sent_at, error),) = await read_db(settings, select(Job.sent_at, Job.error))
    assert sent_at is None and "in time" in error


async def test_an_expired_turn_is_not_charged_to_the_hourly_quota(double, bot_settings):
    settings = bot_settings.model_copy(update={"pickup_timeout": 1.0})
    async with running_bot_on(double, settings, dead_queue(settings)):
        await start(double)
        await admin(double, "quota", {"turns_per_hour": 1})
        for _ in range(2):
            handle = await act(double)
            await accepted(handle)
            await handle.answer()
            await wait_for_db(settings, select(Job.status), lambda rows: rows[-1] == (JobStatus.EXPIRED,))
    assert await read_db(settings, select(Job.status)) == [(JobStatus.EXPIRED,), (JobStatus.EXPIRED,)]
