"""/admin purge, /admin audit, /admin stats."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.errors import fill
from bot.privacy import after_deletion, cancel_sent, deleted_text
from bot.retention import retention_text
from db import moderation
from db.jobs import user_jobs_in_flight

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

log = logging.getLogger(__name__)


def _shown_target(action: str, target: str) -> str:
    """Members and channels as mentions (they ping nobody: the bot allows no mentions); terms as typed."""
    if action in ("ban", "unban", "purge", "player not reached") and target.isdigit():
        return f"<@{target}>"
    if action.startswith("channels") and target.isdigit():
        return f"<#{target}>"
    return discord.utils.escape_markdown(target)


class DataCommands:
    bot: AnimeGamerBot

    @app_commands.command(name="purge", description="Delete a member's characters, turns and clips (privacy)")
    @app_commands.describe(user="whose data to delete")
    async def purge(self, interaction: discord.Interaction, user: discord.User) -> None:
        async with self.bot.sessions() as session, session.begin():
            in_flight = await user_jobs_in_flight(session, interaction.guild_id, user.id)
            stories = await moderation.stories_of_player(session, interaction.guild_id, user.id)
            clips, copies = await moderation.purge_player(session, interaction.guild_id, user.id)
            await moderation.audit(session, interaction.guild_id, interaction.user.id, "purge", str(user.id))
        left = await after_deletion(self.bot, clips, copies, stories)
        said = f"Deleted {user.mention}'s characters and turns, and " + deleted_text(len(clips), left, copies)
        await fill(interaction, said, ephemeral=True)
        await cancel_sent(self.bot.queue, [job.task_id for job in in_flight if job.sent_at is not None])  # unsent: gone

    @app_commands.command(name="audit", description="Recent admin actions on this server")
    async def audit(self, interaction: discord.Interaction) -> None:
        async with self.bot.sessions() as session:
            rows = await moderation.recent_audit(session, interaction.guild_id)
        if not rows:
            await fill(interaction, "No admin actions yet.", ephemeral=True)
            return
        lines = [
            f"<t:{int(r.created_at.timestamp())}:f> {f'<@{r.actor_id}>' if r.actor_id else 'the bot'} {r.action}"
            + (f" {_shown_target(r.action, r.target)}" if r.target else "")
            + (f" ({discord.utils.escape_markdown(r.details)})" if r.details else "")
            for r in rows
        ]
        await fill(interaction, "\n".join(lines)[:2000], ephemeral=True)

    @app_commands.command(name="stats", description="Players, turns today, queue length, average turn time")
    async def stats(self, interaction: discord.Interaction) -> None:
        async with self.bot.sessions() as session:
            stats = await moderation.guild_stats(session, interaction.guild_id)
        average = f"{stats.average_turn_seconds:.1f} s" if stats.average_turn_seconds is not None else "no turns yet"
        await fill(
            interaction,
            f"Players: {stats.players}\nTurns in the last 24 h: {stats.turns_today}\n"
            f"In flight now: {stats.queue_length}\nAverage turn (queued to done): {average}\n"
            f"{retention_text(self.bot.settings)}.",
            ephemeral=True,
        )
