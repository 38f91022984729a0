"""/admin safety: what a clip the nudity detector flags gets, and the score that flags one; /admin reports: the
clips players reported, to remove or dismiss."""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.errors import Refusal, fill
from bot.reports import take_down_clip
from db import moderation
from db.jobs import turn_of_job
from db.models import Job, Turn
from db.reports import DISMISSED, open_reports, resolve_reports
from game.safety import POLICY_WORDS, SafetyPolicy

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

POLICY_CHOICES = [app_commands.Choice(name=words, value=policy.value) for policy, words in POLICY_WORDS.items()]


class SafetyCommands:
    bot: AnimeGamerBot

    @app_commands.command(name="safety", description="What a clip the nudity detector flags gets on this server")
    @app_commands.describe(
        policy="where a flagged clip may be posted (default: nowhere)",
        threshold="the nudity score (0.05-1) that flags a clip; lower flags more",
    )
    @app_commands.choices(policy=POLICY_CHOICES)
    async def safety(
        self,
        interaction: discord.Interaction,
        policy: app_commands.Choice[str] | None = None,
        threshold: app_commands.Range[float, 0.05, 1.0] | None = None,
    ) -> None:
        chosen = SafetyPolicy(policy.value) if policy is not None else None
        cap = self.bot.settings.safety_threshold_max
        if threshold is not None and threshold > cap:
            raise Refusal(f"The threshold may be at most {cap:.2f} on this bot (its operator's cap); lower flags more.")
        async with self.bot.sessions() as session, session.begin():
            now, own = await moderation.set_safety(session, interaction.guild_id, chosen, threshold)
            shown = f"{now.value}, threshold {own if own is not None else self.bot.settings.safety_threshold}"
            if chosen is not None or threshold is not None:
                await moderation.audit(session, interaction.guild_id, interaction.user.id, "safety", None, shown)
        score = (
            f"{own:.2f} (this server's)"
            if own is not None
            else f"{self.bot.settings.safety_threshold:.2f} (the bot's default)"
        )
        await fill(
            interaction,
            f"Every clip is checked by a nudity detector before it is posted. Here {POLICY_WORDS[now]}; "
            f"a clip is flagged at a score of {score}. A withheld clip is never uploaded; its turn still counts.",
            ephemeral=True,
        )

    reports = app_commands.Group(name="reports", description="Clips players reported")

    @reports.command(name="list", description="Clips with open reports, the most reported first")
    async def reports_list(self, interaction: discord.Interaction) -> None:
        async with self.bot.sessions() as session:
            clips = await open_reports(session, interaction.guild_id)
        if not clips:
            await fill(interaction, "No open reports.", ephemeral=True)
            return
        lines = []
        for clip in clips:
            where = (
                f"https://discord.com/channels/{interaction.guild_id}/{clip.channel_id}/{clip.message_id}"
                if clip.channel_id and clip.message_id
                else "not posted"
            )
            lines.append(
                f"job {clip.job_id}: {clip.reports} report(s) since <t:{int(clip.first.timestamp())}:R>, "
                f"<@{clip.user_id}>'s `{discord.utils.escape_markdown(clip.instruction)}` {where}"
            )
        lines.append("`/admin reports remove job:` deletes the message and the clip; `dismiss` keeps them.")
        await fill(interaction, "\n".join(lines)[:2000], ephemeral=True)

    @reports.command(name="remove", description="Delete a turn's posted clip and its message; the turn stays")
    @app_commands.describe(job="the job number /admin reports list shows")
    async def reports_remove(self, interaction: discord.Interaction, job: app_commands.Range[int, 1, None]) -> None:
        found, turn = await self._reported(interaction, job)
        gone = await take_down_clip(self.bot, found, turn, actor_id=interaction.user.id, action="clip removed")
        if gone is None:
            raise Refusal(f"Job {job}'s clip was already taken down.")
        said = f"Job {job}'s clip and its message are deleted; the turn stays."
        await fill(interaction, said + gone.said(), ephemeral=True)

    @reports.command(name="dismiss", description="Close a clip's reports and keep the clip")
    @app_commands.describe(job="the job number /admin reports list shows")
    async def reports_dismiss(self, interaction: discord.Interaction, job: app_commands.Range[int, 1, None]) -> None:
        _, turn = await self._reported(interaction, job)
        async with self.bot.sessions() as session, session.begin():
            closed = await resolve_reports(session, turn.id, DISMISSED, interaction.user.id)
            if closed:
                await moderation.audit(
                    session, interaction.guild_id, interaction.user.id, "reports dismissed", f"job {job}", str(closed)
                )
        if not closed:
            raise Refusal(f"Job {job} has no open reports.")
        await fill(interaction, f"Dismissed {closed} report(s) of job {job}; the clip stays.", ephemeral=True)

    async def _reported(self, interaction: discord.Interaction, job_id: int) -> tuple[Job, Turn]:
        """The job and turn an admin named, refused unless it is this server's."""
        found = None
        if job_id < 2**63:
            async with self.bot.sessions() as session:
                found = await turn_of_job(session, job_id)
        if found is None or found[0].guild_id != interaction.guild_id:
            raise Refusal(f"There is no job {job_id} on this server.")
        return found[0], found[1]
