"""/profile and /board: who plays, what they play most, and which stories drew the most turns this week."""

from __future__ import annotations

import asyncio
import io
from datetime import timedelta
from typing import TYPE_CHECKING

import discord
from discord import app_commands
from discord.ext import commands

from bot.cards import plain
from bot.cogs.community.pictures import board_picture, profile_picture
from bot.cogs.play.character import character_state
from bot.errors import Refusal, defer_publicly, fill
from db import activity
from db.base import utcnow
from game.activity import favourite_actions

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

PROFILE_FILENAME, BOARD_FILENAME = "profile.png", "board.png"
BOARD_DAYS = 7


@app_commands.guild_only()
class Community(commands.Cog):
    def __init__(self, bot: AnimeGamerBot) -> None:
        self.bot = bot

    @app_commands.command(name="profile", description="A player's character, turns, stories and favourite actions")
    @app_commands.describe(player="whose profile (default: yours)")
    async def profile(self, interaction: discord.Interaction, player: discord.Member | None = None) -> None:
        who = player or interaction.user
        await defer_publicly(interaction)
        async with self.bot.sessions() as session:
            found = await activity.profile(session, interaction.guild_id, who.id)
        if found is None:
            raise Refusal(f"{plain(who.display_name, 100)} has no character on this server yet.")
        favourites = favourite_actions(found.lines)
        name = found.character.name if found.character else who.display_name
        state = character_state(found.character) if found.character else None
        picture = await asyncio.to_thread(profile_picture, name, state, found.turns, found.stories, favourites)
        embed = discord.Embed(title=plain(name, 100), description=f"played by {who.mention}")
        embed.add_field(name="turns played", value=str(found.turns))
        embed.add_field(name="stories joined", value=str(found.stories))
        liked = ", ".join(f"{plain(action, 60)} ({times})" for action, times in favourites) or "none yet"
        embed.add_field(name="favourite actions", value=liked, inline=False)
        embed.set_image(url=f"attachment://{PROFILE_FILENAME}")
        await fill(interaction, embed=embed, file=discord.File(io.BytesIO(picture), PROFILE_FILENAME))

    @app_commands.command(name="board", description="This server's most active players and stories this week")
    async def board(self, interaction: discord.Interaction) -> None:
        await defer_publicly(interaction)
        async with self.bot.sessions() as session:
            found = await activity.board(session, interaction.guild_id, utcnow() - timedelta(days=BOARD_DAYS))
        players = [(name, turns) for _, name, turns in found.players]
        picture = await asyncio.to_thread(board_picture, "This week", players, found.stories)
        embed = discord.Embed(title="This week")
        who = [
            f"{rank}. <@{user}> ({plain(name, 60)}): {turns}"
            for rank, (user, name, turns) in enumerate(found.players, 1)
        ]
        told = [f"{rank}. {plain(title, 100)}: {turns}" for rank, (title, turns) in enumerate(found.stories, 1)]
        embed.add_field(name="players, turns", value="\n".join(who) or "no turns this week", inline=False)
        embed.add_field(name="stories, turns", value="\n".join(told) or "no turns this week", inline=False)
        embed.set_image(url=f"attachment://{BOARD_FILENAME}")
        await fill(interaction, embed=embed, file=discord.File(io.BytesIO(picture), BOARD_FILENAME))


async def setup(bot: AnimeGamerBot) -> None:
    await bot.add_cog(Community(bot))
