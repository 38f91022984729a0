"""/admin safety: what a clip the nudity detector flags gets on this server, and the score that flags one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.errors import fill
from db import moderation
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
