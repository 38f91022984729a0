"""The floor for benchmarks/load_players.py: a discord.py bot that answers every command at once, nothing else.

    DISCORD_TOKEN=... DISCORD_API_BASE=... DISCORD_GATEWAY_URL=... python benchmarks/bare_bot.py

It has the same shape as ours (an auto-sharded client, an app command tree) and defers /act and /status
the way ours does, so the difference between the two is what our bot does besides answering.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import discord
from discord import app_commands

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.app import point_at

log = logging.getLogger("bare_bot")


class BareBot(discord.AutoShardedClient):
    def __init__(self) -> None:
        super().__init__(intents=discord.Intents.default())
        self.tree = app_commands.CommandTree(self)

    async def setup_hook(self) -> None:
        await self.tree.sync()

    async def on_ready(self) -> None:
        log.info("ready as %s", self.user)


bot = BareBot()


@bot.tree.command(name="act", description="Answer at once")
async def act(interaction: discord.Interaction, motion: str, background: str) -> None:
    await interaction.response.defer(thinking=True)


@bot.tree.command(name="status", description="Answer at once")
async def status(interaction: discord.Interaction) -> None:
    await interaction.response.defer(ephemeral=True, thinking=True)


if __name__ == "__main__":
    point_at(os.environ.get("DISCORD_API_BASE", ""), os.environ.get("DISCORD_GATEWAY_URL", ""))
    bot.run(os.environ["DISCORD_TOKEN"], root_logger=True)
