"""/queue and /cancel: the player's turns in flight."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.errors import Refusal, defer_privately, fill
from db.jobs import cancel_job, queue_position, user_jobs_in_flight

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

log = logging.getLogger(__name__)


class QueueCommands:
    bot: AnimeGamerBot

    @app_commands.command(name="queue", description="Your turns in flight and their places in the queue")
    @app_commands.guild_only()
    async def queue(self, interaction: discord.Interaction) -> None:
        async with self.bot.sessions() as session:
            jobs = await user_jobs_in_flight(session, interaction.guild_id, interaction.user.id)
            places = [await queue_position(session, job.id) for job in jobs]
        if not jobs:
            await interaction.response.send_message("You have no turns in flight.", ephemeral=True)
            return
        lines = [
            f"• turn {job.id}: " + (f"{place} ahead of it" if place is not None else f"running, {job.progress:.0%}")
            for job, place in zip(jobs, places, strict=True)
        ]
        await interaction.response.send_message("\n".join(lines), ephemeral=True)

    @app_commands.command(name="cancel", description="Cancel your queued or running turn")
    @app_commands.guild_only()
    async def cancel(self, interaction: discord.Interaction) -> None:
        await defer_privately(interaction)  # answer first: telling the workers can wait on a broker
        async with self.bot.sessions() as session, session.begin():
            jobs = await user_jobs_in_flight(session, interaction.guild_id, interaction.user.id)
            cancelled = [job for job in jobs if await cancel_job(session, job.id)]
        self.bot.metrics.turn_ended("cancelled", len(cancelled))
        if not cancelled:
            raise Refusal("You have no turn in flight to cancel.")
        await fill(interaction, "Cancelled; that turn will not change your character.", ephemeral=True)
        supervisor = self.bot.supervisor
        for job in cancelled:
            log.info("job %s cancelled by its player", job.id)
            await self.bot.notices.tell(job, "Cancelled.")
            if job.sent_at is not None:  # its task is with the broker: tell the workers (or the supervisor will)
                await supervisor.mark_cancelled(job)
