"""Server admins: moderation, where and how much the game is played, privacy and audit.

Every command needs Manage Server twice over: ``default_permissions`` hides /admin from others
in Discord's UI, but a server owner can override that, so ``interaction_check`` checks the
member's real permissions in code as well, and then defers the answer (privately) before any
command touches the database. Every action writes an audit row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord import app_commands
from discord.ext import commands

from bot.cogs.admin.data import DataCommands
from bot.cogs.admin.moderation import ModerationCommands
from bot.cogs.admin.safety import SafetyCommands
from bot.cogs.admin.settings import SettingsCommands
from bot.errors import Refusal, defer_privately

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot


def has_manage_guild(interaction: discord.Interaction) -> bool:
    permissions = interaction.permissions
    return permissions.manage_guild or permissions.administrator


@app_commands.guild_only()
@app_commands.default_permissions(manage_guild=True)
class Admin(
    ModerationCommands,
    SettingsCommands,
    SafetyCommands,
    DataCommands,
    commands.GroupCog,
    group_name="admin",
    group_description="Server admin tools for AnimeGamer",
):
    def __init__(self, bot: AnimeGamerBot) -> None:
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        if not has_manage_guild(interaction):
            raise Refusal("You need the Manage Server permission to use admin commands.")
        await defer_privately(interaction)  # every admin command writes (or may wait on a writer): answer first
        return True


async def setup(bot: AnimeGamerBot) -> None:
    await bot.add_cog(Admin(bot))
