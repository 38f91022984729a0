"""`animegamer bot`: the Discord bot. Needs DISCORD_TOKEN; workers run apart (`animegamer worker`).

It stops like a service: SIGTERM (systemd, Docker, Kubernetes) or SIGINT answers new commands with a short
"restarting", closes the gateway and the bot's duties, and exits 0 within ANIMEGAMER_STOP_SECONDS. Turns in
flight stay in the database and the queue; the next start picks them up.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING

from relay.settings import Settings

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

log = logging.getLogger("animegamer.bot")

NO_TOKEN = (
    "Set DISCORD_TOKEN to your bot's token (Discord developer portal > your application > Bot > Reset Token), "
    "in the environment or in .env; see .env.example."
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bot", help="run the Discord bot", description=__doc__)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if settings.discord_token is None or not settings.discord_token.get_secret_value().strip():
        print(NO_TOKEN, file=sys.stderr)
        return 2
    import discord

    from bot.app import AnimeGamerBot
    from bot.clip_store import UnsharedClips
    from db.migrate import DatabaseRefused, SchemaNotCurrent

    settings.data_dir.mkdir(parents=True, exist_ok=True)  # the embedded queue's files and the clips live there
    # One handler, the CLI's: one line per event (discord.py's own would print each line twice, coloured).
    logging.getLogger().setLevel(logging.INFO)
    try:
        return asyncio.run(serve(AnimeGamerBot(settings), settings))
    except discord.LoginFailure:
        print("Discord refused DISCORD_TOKEN: it is wrong or was reset; copy a fresh one.", file=sys.stderr)
        return 1
    except (SchemaNotCurrent, DatabaseRefused, UnsharedClips) as refused:
        print(refused, file=sys.stderr)
        return 1


async def serve(bot: AnimeGamerBot, settings: Settings) -> int:
    """Run until the gateway ends or a stop signal comes; then close within ``settings.stop_seconds``."""
    assert settings.discord_token is not None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    running = asyncio.create_task(bot.start(settings.discord_token.get_secret_value()))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            if running.exception() is not None:  # LoginFailure, an old schema: the process ends with their message
                await bot.close()
                running.result()
            return 0
        log.info("stopping: a stop signal came; new commands are told the bot is restarting")
        bot.stopping = True
        await asyncio.wait_for(bot.close(), timeout=settings.stop_seconds)
        log.info("stopped cleanly")
        return 0
    except TimeoutError:
        log.warning("stopping took longer than %.0f s; exiting anyway", settings.stop_seconds)
        return 0
    finally:
        stopping.cancel()
        if not running.done():
            running.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
