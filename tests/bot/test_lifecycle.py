"""The bot across restarts, syncs, shards and bad tokens."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from sqlalchemy import select, update

from bot.app import AnimeGamerBot
from db.engine import make_engine, make_sessionmaker
from db.jobs import jobs_to_post
from db.models import Job, JobStatus
from tests.bot.conftest import running_bot, wait_for_db
from tests.bot.helpers import accepted
from tests.discord_double import DiscordDouble, member
from tests.workers import REPO

ALICE = member("alice")
CLIP_POSTS = r"/channels/\d+/messages"


def clip_posts(double: DiscordDouble) -> list:
    return [c for c in double.calls_to("POST", CLIP_POSTS) if any(f.filename.endswith(".mp4") for f in c.files)]


async def act(double: DiscordDouble) -> None:
    await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
    await accepted(await double.slash("act", {"motion": "gently lie down", "background": "day grass"}, user=ALICE))


async def test_a_restart_with_unchanged_commands_does_not_sync_again(double, bot_settings):
    async with running_bot(double, bot_settings):
        pass
    async with running_bot(double, bot_settings):
        pass
    assert double.sync_count == 1


@pytest.mark.slow
async def test_a_bot_stopped_while_its_turn_runs_posts_the_clip_once_after_restarting(
    double, worker_settings, sqlite_worker
):
    async with running_bot(double, worker_settings, sqlite_worker) as bot:
        await act(double)
        await wait_for_db(worker_settings, select(Job.id), lambda rows: len(rows) == 1)
        await bot.supervisor.stop()  # the process dies before it sees the result
    async with running_bot(double, worker_settings, sqlite_worker):
        await double.wait_for("POST", CLIP_POSTS, timeout=90)
        await wait_for_db(worker_settings, select(Job.result_message_id), lambda rows: rows[0][0] is not None)
        await asyncio.sleep(1.0)  # a few more delivery ticks: nothing else may be posted
    assert len(clip_posts(double)) == 1


@pytest.mark.slow
async def test_a_bot_killed_between_posting_and_recording_does_not_post_twice(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        await act(double)
        rows = await wait_for_db(worker_settings, select(Job.id, Job.result_message_id), lambda r: r and r[0][1])
    # As if the bot died after Discord made the message but before the database heard of it:
    engine = make_engine(worker_settings.database_url)
    async with make_sessionmaker(engine)() as session, session.begin():
        await session.execute(update(Job).values(result_message_id=None))
    await engine.dispose()

    async with running_bot(double, worker_settings, sqlite_worker):
        again = await wait_for_db(worker_settings, select(Job.result_message_id), lambda r: r[0][0] is not None)
    assert again[0][0] == rows[0][1]  # Discord answered the repeated nonce with the first message
    assert len([m for m in double.messages() if any(a["filename"].endswith(".mp4") for a in m.attachments)]) == 1


@pytest.mark.slow
async def test_a_reading_of_the_turns_to_post_taken_before_this_process_posted_one_does_not_post_it_again(
    double, worker_settings, sqlite_worker
):
    """A tick reads the finished turns not yet posted while this process's own post of one is committing; by the time
    it looks for that post's task, the task has ended. Seen as a second create-message call under load."""
    double.fail("POST", CLIP_POSTS, status=0, delay=2.0, times=None)  # a slow Discord: the post is in flight a while
    async with running_bot(double, worker_settings, sqlite_worker) as bot:
        await act(double)
        await wait_for_db(worker_settings, select(Job.status), lambda rows: rows[0][0] == JobStatus.DONE, timeout=90)
        async with bot.sessions() as session:
            stale = await jobs_to_post(session)  # its post is on its way, not yet recorded
        await wait_for_db(worker_settings, select(Job.result_message_id), lambda rows: rows[0][0] is not None)
        assert len(stale) == 1
        await bot.delivery.post(stale[0])
    assert len(clip_posts(double)) == 1


@pytest.mark.slow
async def test_the_reroll_button_works_after_a_restart(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        await act(double)
        ((job_id, message_id),) = await wait_for_db(
            worker_settings, select(Job.id, Job.result_message_id), lambda r: r and r[0][1]
        )
    async with running_bot(double, worker_settings, sqlite_worker):
        click = await double.button(message_id, f"ag:turn:{job_id}:reroll", user=ALICE)
        await accepted(click)
        jobs = await wait_for_db(
            worker_settings,
            select(Job.kind, Job.status, Job.result_message_id).order_by(Job.id),
            lambda r: len(r) == 2 and all(message for *_, message in r),
        )
    assert jobs[1][:2] == ("reroll", JobStatus.DONE)
    assert len(clip_posts(double)) == 2


async def test_two_shards_connect_when_shard_count_is_two(bot_settings):
    async with DiscordDouble(shard_count=2) as double:
        settings = bot_settings.model_copy(update={"shard_count": 2})
        async with running_bot(double, settings) as bot:
            assert bot.shard_count == 2
            assert sorted(double.shards) == [0, 1]


async def test_a_process_given_shard_ids_connects_those_shards_alone(bot_settings):
    async with DiscordDouble(shard_count=4) as double:
        settings = bot_settings.model_copy(update={"shard_count": 4, "shard_ids": [1, 3]})
        async with running_bot(double, settings) as bot:
            assert (bot.shard_count, bot.shard_ids) == (4, [1, 3])
            assert sorted(double.shards) == [1, 3]


async def test_the_bot_reaches_discord_through_the_configured_proxy_urls(worker_settings, sqlite_worker):
    async with DiscordDouble() as double:
        settings = worker_settings.model_copy(
            update={"discord_api_base": double.api_base, "discord_gateway_url": double.gateway_url}
        )
        bot = AnimeGamerBot(settings, celery_app=sqlite_worker.app)
        import discord

        assert double.api_base == discord.http.Route.BASE
        async with double.running(bot):
            assert bot.get_guild(double.guild.id) is not None


async def animegamer_bot(env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "animegamer",
        "bot",
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, err.decode()


async def test_the_bot_without_a_token_says_what_to_set(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DISCORD_TOKEN"} | {"ANIMEGAMER_DATA_DIR": str(tmp_path)}
    code, err = await animegamer_bot(env)
    assert code == 2 and "Set DISCORD_TOKEN" in err


async def test_the_bot_with_a_wrong_token_says_so_and_does_not_print_it(tmp_path):
    async with DiscordDouble(token="the-right-one") as double:
        env = os.environ | {
            "DISCORD_TOKEN": "a-wrong-token",
            "DISCORD_API_BASE": double.api_base,
            "DISCORD_GATEWAY_URL": double.gateway_url,
            "ANIMEGAMER_DATA_DIR": str(tmp_path),
        }
        code, err = await animegamer_bot(env)
    assert code == 1 and "Discord refused DISCORD_TOKEN" in err
    assert "a-wrong-token" not in err
