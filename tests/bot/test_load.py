"""Fifty players act at the same instant against the real bot process: every turn ends exactly once.

The short version of benchmarks/load_players.py (which measures times; this asserts outcomes only).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crowd import BotProcess, World, bot_argv, burst, count, crowd, late, settle, setup_servers
from tests.discord_double import DiscordDouble
from tests.workers import Worker

pytestmark = [pytest.mark.slow, pytest.mark.redis]

PLAYERS = 50


async def test_a_burst_of_fifty_players_gets_every_turn_posted_exactly_once(redis_worker: Worker, tmp_path: Path):
    world = World.around(redis_worker, tmp_path)
    guilds, players = crowd(PLAYERS, guilds=5)
    database = tmp_path / "bot" / "game.db"
    async with DiscordDouble(guilds, strict=True) as double:
        bot = BotProcess(bot_argv(), world.bot_env(double, database), tmp_path / "bot.log").start()
        try:
            await bot.ready(double, ("act", "start", "admin"))
            await setup_servers(double, guilds, players)
            handles = await burst(double, players)
            jobs = await settle(double, database, handles, timeout=300)
        finally:
            bot.stop()
    outcome = count(double, jobs)
    assert late(handles) == 0, "some players got Discord's 10062 (answered after 3 s)"
    assert outcome.accepted == PLAYERS, bot.log.read_text(errors="replace")[-3000:]
    assert (outcome.lost, outcome.duplicates, outcome.told) == (0, 0, 0)
    assert outcome.delivered_once == PLAYERS
