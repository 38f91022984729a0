"""Sync slash commands only when their definitions changed: Discord counts creates per day.

The hash of the command tree as Discord would receive it is kept in ``app_state``; a restart
with the same commands syncs nothing. With ``DEV_GUILD`` set the commands go to that guild
(instant) instead of globally (up to an hour to appear).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING

import discord

from db.queries import get_app_state, set_app_state

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

log = logging.getLogger(__name__)


def commands_hash(bot: AnimeGamerBot) -> str:
    payload = sorted((command.to_dict(bot.tree) for command in bot.tree.get_commands()), key=lambda c: c["name"])
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


async def sync_if_changed(bot: AnimeGamerBot) -> bool:
    dev_guild = bot.settings.dev_guild
    key = f"commands_hash:{dev_guild or 'global'}"
    digest = commands_hash(bot)
    async with bot.sessions() as session, session.begin():
        if await get_app_state(session, key) == digest:
            log.info("slash commands unchanged; not syncing")
            return False
    if dev_guild:
        guild = discord.Object(dev_guild)
        bot.tree.copy_global_to(guild=guild)
        await bot.tree.sync(guild=guild)
    else:
        await bot.tree.sync()
    async with bot.sessions() as session, session.begin():
        await set_app_state(session, key, digest)
    log.info("slash commands synced (%s)", f"guild {dev_guild}" if dev_guild else "global")
    return True
