"""Refusals: one short sentence that says why and what to do, shown only to the player.

Commands raise ``Refusal`` (or let a ``game.errors.GameError`` rise) from anywhere below them;
the tree's error handler answers it privately. A database that stays locked past its busy
timeout is answered as "busy, try again". Anything else is a bug: logged with its traceback and
an error id, and the player gets that id.

A command that deferred publicly (``defer_publicly``: a turn's progress message) and is then
refused must not answer in public: the first followup after a public defer would fill the
visible "thinking" message. So the deferred message is deleted first and the refusal sent as
an ephemeral followup.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import discord
from discord import app_commands
from sqlalchemy.exc import OperationalError

from game.errors import GameError

log = logging.getLogger(__name__)

PUBLIC_DEFER = "animegamer_public_defer"  # interaction.extras key: deferred publicly, not yet filled
BUSY = "The game's database is busy right now; nothing changed. Please try again in a moment."


class Refusal(app_commands.AppCommandError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


async def defer_publicly(interaction: discord.Interaction) -> None:
    """Answer within Discord's 3 s with a public "thinking…"; the command fills it later (or refuses)."""
    await interaction.response.defer(thinking=True)
    interaction.extras[PUBLIC_DEFER] = True


async def defer_privately(interaction: discord.Interaction) -> None:
    """Answer within Discord's 3 s with a private "thinking…"; the first followup fills it."""
    await interaction.response.defer(ephemeral=True, thinking=True)


async def fill(interaction: discord.Interaction, content: str | None = None, **kwargs: Any) -> discord.Message:
    """Fill a deferred answer (the first followup replaces the "thinking…" message)."""
    interaction.extras.pop(PUBLIC_DEFER, None)
    return await interaction.followup.send(content, wait=True, **kwargs)


async def answer_privately(interaction: discord.Interaction, message: str) -> None:
    """Reply ephemerally whether or not the interaction was already answered or deferred."""
    if not interaction.response.is_done():
        await interaction.response.send_message(message, ephemeral=True)
        return
    if interaction.extras.pop(PUBLIC_DEFER, False):
        try:
            await interaction.delete_original_response()
        except discord.HTTPException as exc:
            log.info("deferred answer not deleted (%s)", exc)
    await interaction.followup.send(message, ephemeral=True)


def refusal_text(error: BaseException) -> str | None:
    """The sentence to show for an expected error, or None for a bug."""
    if isinstance(error, app_commands.CommandInvokeError):
        error = error.original
    if isinstance(error, Refusal):
        return error.message
    if isinstance(error, GameError):
        return str(error)
    if isinstance(error, app_commands.CheckFailure) and str(error):
        return str(error)
    if isinstance(error, OperationalError) and "locked" in str(error.orig):
        return BUSY
    return None


async def on_app_command_error(interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
    await refuse_or_raise(interaction, error)


UNKNOWN_INTERACTION = 10062  # Discord's answer to a reply that came after the 3 s deadline


async def refuse_or_raise(interaction: discord.Interaction, error: BaseException) -> None:
    """Answer an expected error with its sentence; log anything else with an id the player can quote."""
    original = error.original if isinstance(error, app_commands.CommandInvokeError) else error
    if isinstance(original, discord.NotFound) and original.code == UNKNOWN_INTERACTION:
        # The reply was lost or late (Discord already told the player the interaction failed); nothing
        # was committed before it, so there is nothing to undo and nobody left to answer.
        log.warning("interaction %s expired before it was answered; nothing was done", interaction.id)
        return
    text = refusal_text(error)
    if text is None:
        eid = secrets.token_hex(3)
        name = interaction.command.qualified_name if interaction.command else "interaction"
        log.error("%s failed [error %s]", name, eid, exc_info=error)
        text = f"Something went wrong on our side (error `{eid}`); it was logged. Please try again."
    try:
        await answer_privately(interaction, text)
    except discord.HTTPException as exc:  # the token expired, or Discord is down: nothing left to answer on
        log.warning("could not answer %s (%s)", interaction.id, exc)
