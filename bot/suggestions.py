"""Autocomplete for motions and backgrounds: what the model knows, and what this server played most.

Discord drops an autocomplete answer that comes late, and a player types a letter every fraction of a second, so
the answer never waits long on the database: each server's most played lines are read at most once a minute,
in a task of their own, and a read that takes longer than ``WAIT_SECONDS`` leaves this answer to the model's
vocabulary alone (the next one has the server's too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from db.base import utcnow
from db.queries import played_lines
from game.suggestions import most_played, suggest, vocabulary_for

if TYPE_CHECKING:
    from db.engine import Sessions
    from relay.settings import Settings

log = logging.getLogger(__name__)

FRESH_SECONDS = 60.0  # how long a server's most played lines are reused before they are read again
WAIT_SECONDS = 0.5  # the most an answer waits for that read
PLAYED_DAYS = 30  # "most played" counts the turns of this many days


class Suggestions:
    def __init__(self, settings: Settings, sessions: Sessions) -> None:
        self.settings, self.sessions = settings, sessions
        self._played: dict[int, tuple[float, list[str], list[str]]] = {}  # guild -> (read at, motions, backgrounds)
        self._reading: dict[int, asyncio.Task[None]] = {}

    async def motions(self, guild_id: int | None, typed: str) -> list[app_commands.Choice[str]]:
        played, _ = await self._most_played(guild_id)
        return _choices(suggest(typed, played, vocabulary_for(self.settings.model).motions))

    async def backgrounds(self, guild_id: int | None, typed: str) -> list[app_commands.Choice[str]]:
        _, played = await self._most_played(guild_id)
        return _choices(suggest(typed, played, vocabulary_for(self.settings.model).backgrounds))

    async def _most_played(self, guild_id: int | None) -> tuple[list[str], list[str]]:
        if guild_id is None:
            return [], []
        known = self._played.get(guild_id)
        if known is None or time.monotonic() - known[0] > FRESH_SECONDS:
            if guild_id not in self._reading:
                self._reading[guild_id] = asyncio.create_task(self._read(guild_id))
            if known is None:  # nothing to show yet: wait a little for it
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._reading[guild_id]), WAIT_SECONDS)
                known = self._played.get(guild_id)
        return (known[1], known[2]) if known else ([], [])

    async def _read(self, guild_id: int) -> None:
        try:
            async with self.sessions() as session:
                lines = await played_lines(session, guild_id, utcnow() - timedelta(days=PLAYED_DAYS))
            self._played[guild_id] = (time.monotonic(), *most_played(lines))
        except Exception:  # a busy or closed database: suggestions go on with the model's vocabulary
            log.warning("guild %s: most played lines not read", guild_id, exc_info=True)
        finally:
            self._reading.pop(guild_id, None)


async def motion_choices(interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
    """The autocomplete of every command's ``motion`` option."""
    return await interaction.client.suggestions.motions(interaction.guild_id, current)


async def background_choices(interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
    """The autocomplete of every command's ``background`` option."""
    return await interaction.client.suggestions.backgrounds(interaction.guild_id, current)


def _choices(texts: list[str]) -> list[app_commands.Choice[str]]:
    return [app_commands.Choice(name=text, value=text) for text in texts]
