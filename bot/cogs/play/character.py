"""/start, /status, /history, /reset: the player's character in this server."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.cards import GAUGE_FILENAME, render_gauges, state_embed
from bot.clip_deletes import delete_owed
from bot.confirm import Confirm
from bot.errors import Refusal, defer_privately, fill
from bot.turns import check_served
from db.jobs import has_turn_in_flight
from db.queries import active_character, get_or_create_character, recent_turns, reset_character
from game.instruction import InstructionError, from_fields
from game.state import CharacterState

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot


def character_state(character) -> CharacterState:
    return CharacterState(stamina=character.stamina, social=character.social, entertainment=character.entertainment)


def checked_name(name: str) -> str:
    """A character name must be a valid Character field of an instruction."""
    try:
        return from_fields(name, "wave", "town").character
    except InstructionError as exc:
        raise Refusal(exc.reason.replace("Character", "The name")) from exc


class CharacterCommands:
    bot: AnimeGamerBot

    @app_commands.command(name="start", description="Pick or create your character in this server")
    @app_commands.describe(character="who you play (the model knows the suggested ones best)")
    @app_commands.guild_only()
    async def start(self, interaction: discord.Interaction, character: app_commands.Range[str, 1, 60]) -> None:
        name = checked_name(character)
        check_served(self.bot, name)
        await defer_privately(interaction)
        async with self.bot.sessions() as session, session.begin():
            current = await active_character(session, interaction.guild_id, interaction.user.id)
            if current is not None and current.name != name and await has_turn_in_flight(session, current):
                raise Refusal(f"{current.name} has a turn in flight; switch when it is done.")
            chosen = await get_or_create_character(session, interaction.guild_id, interaction.user.id, name)
            state = character_state(chosen)
        await fill(
            interaction,
            f"You play **{discord.utils.escape_markdown(name)}**. Take a turn with /act.",
            embed=state_embed(name, state),
            file=discord.File(_png(state), GAUGE_FILENAME),
            ephemeral=True,
        )

    @start.autocomplete("character")
    async def start_character(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
        return await character_choices(self.bot, current)

    @app_commands.command(name="status", description="Your character's card")
    @app_commands.guild_only()
    async def status(self, interaction: discord.Interaction) -> None:
        # Answer first: while clips are being posted the database and the event loop are shared with them.
        await defer_privately(interaction)
        async with self.bot.sessions() as session:
            character = await active_character(session, interaction.guild_id, interaction.user.id)
        if character is None:
            raise Refusal("You have no character here yet; pick one with /start.")
        state = character_state(character)
        await fill(
            interaction,
            embed=state_embed(character.name, state),
            file=discord.File(_png(state), GAUGE_FILENAME),
            ephemeral=True,
        )

    @app_commands.command(name="history", description="Your character's last turns")
    @app_commands.guild_only()
    async def history(self, interaction: discord.Interaction) -> None:
        await defer_privately(interaction)
        async with self.bot.sessions() as session:
            character = await active_character(session, interaction.guild_id, interaction.user.id)
            turns = await recent_turns(session, character.id) if character else []
        if character is None:
            raise Refusal("You have no character here yet; pick one with /start.")
        if not turns:
            await fill(interaction, f"{character.name} has no turns yet; try /act.", ephemeral=True)
            return
        lines = [
            f"• {discord.utils.escape_markdown(t.instruction)} — stamina {t.stamina_after}, social {t.social_after}, "
            f"entertainment {t.entertainment_after}" + (" (clip expired)" if t.clip_expired_at else "")
            for t in turns
        ]
        await fill(interaction, "\n".join(lines), ephemeral=True)

    @app_commands.command(name="reset", description="Start your character over (asks first)")
    @app_commands.guild_only()
    async def reset(self, interaction: discord.Interaction) -> None:
        async with self.bot.sessions() as session:
            character = await active_character(session, interaction.guild_id, interaction.user.id)
        if character is None:
            raise Refusal("You have no character here yet; pick one with /start.")
        view = Confirm(
            interaction.user.id, yes=("Start over", "Starting over…"), no=("Keep playing", "Nothing changed.")
        )
        await interaction.response.send_message(
            f"Start {discord.utils.escape_markdown(character.name)} over? Stats go back to 50 and past turns are "
            "forgotten (turns in shared stories stay there).",
            view=view,
            ephemeral=True,
        )
        await view.wait()
        if not view.confirmed:
            return
        async with self.bot.sessions() as session, session.begin():
            character = await active_character(session, interaction.guild_id, interaction.user.id)
            if character is None:
                return
            busy = await has_turn_in_flight(session, character)
            owed = [] if busy else await reset_character(session, character)
        # Answered after the transaction: no Discord call while the database's write lock is held.
        done = f"{discord.utils.escape_markdown(character.name)} starts over."
        await interaction.edit_original_response(
            content="A turn is in flight; try again when it is done." if busy else done
        )
        await delete_owed(self.bot.sessions, self.bot.clips, owed)  # what the store cannot do now, retention retries


async def character_choices(bot: AnimeGamerBot, current: str) -> list[app_commands.Choice[str]]:
    """Autocomplete suggests; the command still validates whatever is typed."""
    wanted = current.casefold()
    served = bot.served_characters()
    offered = bot.settings.characters if served is None else served  # the published model: only what is served
    names = [name for name in offered if wanted in name.casefold()]
    return [app_commands.Choice(name=name, value=name) for name in names[:25]]


def _png(state: CharacterState) -> io.BytesIO:
    return io.BytesIO(render_gauges(state))
