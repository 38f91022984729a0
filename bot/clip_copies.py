"""Taking down the posted copies of a removed clip: the /story recap and /story page messages that hold it.

``db/clip_copies.py`` marks them withdrawn in the transaction that takes the clip away; here their messages are
deleted and their rows dropped. The process that took the clip away calls ``take_down_withdrawn`` at once, and every
bot process's retention loop calls it each minute, so a message Discord would not delete now (an outage, a rate
limit) goes on the next try. Deleting a message already gone is done.
"""

from __future__ import annotations

import logging

import aiohttp
import discord

from db import clip_copies
from db.engine import Sessions

log = logging.getLogger(__name__)


async def take_down_withdrawn(bot: discord.Client, sessions: Sessions) -> int:
    """Delete the messages of withdrawn copies; returns how many are still up (tried again next minute)."""
    async with sessions() as session:
        withdrawn = await clip_copies.withdrawn(session)
    done: list[int] = []
    left = 0
    for copy in withdrawn:
        channel = bot.get_partial_messageable(copy.channel_id, guild_id=copy.guild_id)
        try:
            await channel.get_partial_message(copy.message_id).delete()
        except discord.NotFound:
            pass  # deleted in Discord already
        except discord.Forbidden as exc:  # the bot lost the channel: nothing it can ever do here
            log.warning("story %s %s message %s cannot be deleted (%s)", copy.story_id, copy.kind, copy.message_id, exc)
        except (discord.HTTPException, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("story %s %s message %s not deleted now (%s)", copy.story_id, copy.kind, copy.message_id, exc)
            left += 1
            continue
        done.append(copy.id)
        log.info(
            "story %s: %s message %s taken down (a clip in it was removed)", copy.story_id, copy.kind, copy.message_id
        )
    async with sessions() as session, session.begin():
        await clip_copies.taken_down(session, done)
    return left
