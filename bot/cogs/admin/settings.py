"""/admin channels allow|deny|list, /admin quota, /admin history, /admin pause|resume."""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.errors import Refusal, fill
from db import moderation
from game.history import MAX_WINDOW

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot


class SettingsCommands:
    bot: AnimeGamerBot
    channels = app_commands.Group(name="channels", description="Where the game may be played")

    @channels.command(name="allow", description="Allow play in a channel (once any is listed, only those)")
    @app_commands.describe(channel="the channel")
    async def channels_allow(self, interaction: discord.Interaction, channel: discord.TextChannel) -> None:
        async with self.bot.sessions() as session, session.begin():
            await moderation.allow_channel(session, interaction.guild_id, channel.id)
            await moderation.audit(
                session, interaction.guild_id, interaction.user.id, "channels allow", str(channel.id)
            )
        await fill(interaction, f"The game may be played in {channel.mention}.", ephemeral=True)

    @channels.command(name="deny", description="Take a channel off the allowed list")
    @app_commands.describe(channel="the channel")
    async def channels_deny(self, interaction: discord.Interaction, channel: discord.TextChannel) -> None:
        async with self.bot.sessions() as session, session.begin():
            removed = await moderation.deny_channel(session, interaction.guild_id, channel.id)
            if removed:
                await moderation.audit(
                    session, interaction.guild_id, interaction.user.id, "channels deny", str(channel.id)
                )
            left = await moderation.list_channels(session, interaction.guild_id)
        if not removed:
            raise Refusal(f"{channel.mention} was not on the allowed list.")
        note = "" if left else " No channel is listed now, so the game may be played everywhere."
        await fill(interaction, f"{channel.mention} is off the list.{note}", ephemeral=True)

    @channels.command(name="list", description="Where the game may be played")
    async def channels_list(self, interaction: discord.Interaction) -> None:
        async with self.bot.sessions() as session:
            channels = await moderation.list_channels(session, interaction.guild_id)
        text = ", ".join(f"<#{c}>" for c in channels) if channels else "Every channel (none is listed)."
        await fill(interaction, text, ephemeral=True)

    @app_commands.command(name="quota", description="Turns per player per hour, and the server's queue cap")
    @app_commands.describe(
        turns_per_hour="per player (0 stops play)", max_queued="turns in flight at once, server-wide"
    )
    async def quota(
        self,
        interaction: discord.Interaction,
        turns_per_hour: app_commands.Range[int, 0, 1000] | None = None,
        max_queued: app_commands.Range[int, 0, 1000] | None = None,
    ) -> None:
        async with self.bot.sessions() as session, session.begin():
            per_hour, cap = await moderation.set_quota(session, interaction.guild_id, turns_per_hour, max_queued)
            if turns_per_hour is not None or max_queued is not None:
                await moderation.audit(
                    session, interaction.guild_id, interaction.user.id, "quota", None, f"{per_hour}/h, cap {cap}"
                )
        await fill(
            interaction,
            f"{per_hour} turns per player per hour; at most {cap} turns in flight on this server.",
            ephemeral=True,
        )

    @app_commands.command(name="history", description="How many turns the model sees at once (1: the new one alone)")
    @app_commands.describe(window="turns in each prompt, the new one included")
    async def history(
        self, interaction: discord.Interaction, window: app_commands.Range[int, 1, MAX_WINDOW] | None = None
    ) -> None:
        async with self.bot.sessions() as session, session.begin():
            turns = await moderation.set_history_window(session, interaction.guild_id, window)
            if window is not None:
                await moderation.audit(session, interaction.guild_id, interaction.user.id, "history", None, str(turns))
        past = "no past turns" if turns == 1 else f"the {turns - 1} turns before it"
        await fill(interaction, f"Each turn is made with {past}.", ephemeral=True)

    @app_commands.command(name="pause", description="Pause generation on this server")
    async def pause(self, interaction: discord.Interaction) -> None:
        await self._set_paused(interaction, True)

    @app_commands.command(name="resume", description="Resume generation on this server")
    async def resume(self, interaction: discord.Interaction) -> None:
        await self._set_paused(interaction, False)

    async def _set_paused(self, interaction: discord.Interaction, paused: bool) -> None:
        word = "pause" if paused else "resume"
        async with self.bot.sessions() as session, session.begin():
            changed = await moderation.set_paused(session, interaction.guild_id, paused)
            if changed:
                await moderation.audit(session, interaction.guild_id, interaction.user.id, word)
        state = "paused" if paused else "running"
        await fill(
            interaction, f"Generation is {state}." if changed else f"Generation was already {state}.", ephemeral=True
        )
