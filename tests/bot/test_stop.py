"""The bot stops like a service: SIGTERM, as systemd, `docker stop` and Kubernetes send it, ends the process
with exit status 0 within its bound, and a turn it held is posted once by the next start."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from sqlalchemy import select

from db.models import Job
from tests.bot.conftest import running_bot, wait_for_db
from tests.bot.helpers import private_text
from tests.crowd import BotProcess, bot_argv, burst, count, crowd, discord_env, settle, setup_servers
from tests.discord_double import DiscordDouble
from tests.workers import Worker, settings_for

STOP_SECONDS = 30


async def test_sigterm_mid_turn_exits_0_and_the_next_start_posts_the_turn_once(sqlite_worker: Worker, tmp_path: Path):
    database = tmp_path / "game.db"
    guilds, players = crowd(1, guilds=1)
    async with DiscordDouble(guilds, strict=True) as double:
        env = {
            **sqlite_worker.env,
            **discord_env(double),
            "ANIMEGAMER_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
            "ANIMEGAMER_DELIVERY_POLL_SECONDS": "0.2",
            "ANIMEGAMER_STOP_SECONDS": str(STOP_SECONDS),
        }
        first = BotProcess(bot_argv(), env, tmp_path / "first.log").start()
        try:
            await first.ready(double, ("act", "start", "admin"))
            await setup_servers(double, guilds, players)
            handles = await burst(double, players)
            sent = select(Job.sent_at)  # the turn is with the worker: SIGTERM comes mid-turn
            await wait_for_db(settings_for(env), sent, lambda rows: rows and rows[0][0] is not None)
            assert first.proc is not None
            asked = time.monotonic()
            first.proc.send_signal(signal.SIGTERM)
            status = await asyncio.to_thread(first.proc.wait, STOP_SECONDS + 10)
            took = time.monotonic() - asked
        finally:
            first.stop()
        log = first.log.read_text(errors="replace")
        assert status == 0, log[-3000:]
        assert "stopped cleanly" in log and took < STOP_SECONDS, log[-3000:]
        second = BotProcess(bot_argv(), env, tmp_path / "second.log").start()
        try:
            await second.ready(double, ("act",))
            jobs = await settle(double, database, handles, timeout=120)
        finally:
            second.stop()
    outcome = count(double, jobs)
    assert (outcome.delivered_once, outcome.duplicates, outcome.lost) == (1, 0, 0), second.log.read_text()[-3000:]


async def test_a_command_that_arrives_while_the_bot_stops_is_told_to_come_back(double, bot_settings):
    async with running_bot(double, bot_settings) as bot:
        bot.stopping = True  # what SIGTERM sets (animegamer.cli.bot) before it closes the gateway
        handle = await double.slash("status")
        assert "restarting" in private_text(await handle.answer())
