"""Refusals: one short sentence that says why and what to do, shown only to the player.

Commands raise ``Refusal`` from anywhere below them; the tree's error handler answers it
ephemerally. Anything else is a bug: logged with its traceback, and the player told so.
"""

from __future__ import annotations

import logging

import discord
from discord import app_commands

log = logging.getLogger(__name__)


class Refusal(app_commands.AppCommandError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


async def answer_privately(interaction: discord.Interaction, message: str) -> None:
    """Reply ephemerally whether or not the interaction was already answered or deferred."""
    if interaction.response.is_done():
        await interaction.followup.send(message, ephemeral=True)
    else:
        await interaction.response.send_message(message, ephemeral=True)


async def on_app_command_error(interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
    if isinstance(error, app_commands.CommandInvokeError) and isinstance(error.original, Refusal):
        error = error.original
    if isinstance(error, Refusal | app_commands.CheckFailure) and str(error):
        await answer_privately(interaction, str(error))
        return
    log.error("command %s failed", interaction.command and interaction.command.qualified_name, exc_info=error)
    await answer_privately(interaction, "Something went wrong on our side; it was logged. Please try again.")


async def refuse_or_raise(interaction: discord.Interaction, error: Exception) -> None:
    """For buttons and modals, whose errors do not reach the tree's handler."""
    if isinstance(error, Refusal):
        await answer_privately(interaction, error.message)
        return
    log.error("interaction failed", exc_info=error)
    await answer_privately(interaction, "Something went wrong on our side; it was logged. Please try again.")
