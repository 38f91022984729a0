"""Playing alone: pick a character, take turns, see and manage your queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord.ext import commands

from bot.buttons import submit_continue
from bot.cogs.play.act import ActCommands
from bot.cogs.play.character import CharacterCommands
from bot.cogs.play.queue import QueueCommands

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot


class Play(CharacterCommands, ActCommands, QueueCommands, commands.Cog):
    def __init__(self, bot: AnimeGamerBot) -> None:
        self.bot = bot

    @commands.Cog.listener()
    async def on_interaction(self, interaction: discord.Interaction) -> None:
        await submit_continue(interaction)


async def setup(bot: AnimeGamerBot) -> None:
    await bot.add_cog(Play(bot))
