"""A fresh double and a fresh bot per test: discord.py keeps state on the client, the double on itself."""

from __future__ import annotations

from collections.abc import AsyncIterator

import discord
import pytest
from discord.ext import commands

from tests.discord_double import DiscordDouble


@pytest.fixture
async def double() -> AsyncIterator[DiscordDouble]:
    async with DiscordDouble() as started:
        yield started


@pytest.fixture
def bot() -> commands.Bot:
    """Not started: a test adds its commands first, then runs it with ``double.running(bot)``."""
    return commands.Bot(command_prefix="!", intents=discord.Intents.default())
