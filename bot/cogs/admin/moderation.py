"""/admin ban|unban and /admin terms add|remove|list."""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.errors import Refusal, fill
from db import moderation
from game.text import clean_text

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot


class ModerationCommands:
    bot: AnimeGamerBot
    terms = app_commands.Group(name="terms", description="Terms no instruction may contain")

    @app_commands.command(name="ban", description="Stop a member from playing on this server")
    @app_commands.describe(user="who", reason="shown to them when they try to play")
    async def ban(
        self,
        interaction: discord.Interaction,
        user: discord.User,
        reason: app_commands.Range[str, 1, 200] | None = None,
    ) -> None:
        reason = clean_text(reason, label="The reason", max_chars=200) if reason is not None else None
        async with self.bot.sessions() as session, session.begin():
            new = await moderation.ban(session, interaction.guild_id, user.id, reason, interaction.user.id)
            await moderation.audit(
                session, interaction.guild_id, interaction.user.id, "ban", str(user.id), reason or ""
            )
        verb = "is now banned" if new else "was already banned (reason updated)"
        await fill(interaction, f"{user.mention} {verb} from the game.", ephemeral=True)

    @app_commands.command(name="unban", description="Let a banned member play again")
    @app_commands.describe(user="who")
    async def unban(self, interaction: discord.Interaction, user: discord.User) -> None:
        async with self.bot.sessions() as session, session.begin():
            removed = await moderation.unban(session, interaction.guild_id, user.id)
            if removed:
                await moderation.audit(session, interaction.guild_id, interaction.user.id, "unban", str(user.id))
        if not removed:
            raise Refusal(f"{user.mention} is not banned.")
        await fill(interaction, f"{user.mention} may play again.", ephemeral=True)

    @terms.command(name="add", description="Block a term in instructions")
    @app_commands.describe(term="a word or phrase, matched ignoring case")
    async def terms_add(self, interaction: discord.Interaction, term: app_commands.Range[str, 1, 100]) -> None:
        term = moderation.normalize_term(term)  # TextError (a refusal) for empty, invisible or control text
        async with self.bot.sessions() as session, session.begin():
            new = await moderation.add_term(session, interaction.guild_id, term, interaction.user.id)
            await moderation.audit(session, interaction.guild_id, interaction.user.id, "terms add", term)
        await fill(interaction, "Blocked." if new else "That term was already blocked.", ephemeral=True)

    @terms.command(name="remove", description="Unblock a term")
    @app_commands.describe(term="a blocked term")
    async def terms_remove(self, interaction: discord.Interaction, term: app_commands.Range[str, 1, 100]) -> None:
        term = moderation.normalize_term(term)
        async with self.bot.sessions() as session, session.begin():
            removed = await moderation.remove_term(session, interaction.guild_id, term)
            if removed:
                await moderation.audit(session, interaction.guild_id, interaction.user.id, "terms remove", term)
        if not removed:
            raise Refusal("That term is not blocked; /admin terms list shows the blocked ones.")
        await fill(interaction, "Unblocked.", ephemeral=True)

    @terms.command(name="list", description="The blocked terms")
    async def terms_list(self, interaction: discord.Interaction) -> None:
        async with self.bot.sessions() as session:
            terms = await moderation.list_terms(session, interaction.guild_id)
        text = ", ".join(f"`{t}`" for t in terms) if terms else "No terms are blocked."
        await fill(interaction, text[:2000], ephemeral=True)
