"""`animegamer bot`: the Discord bot. Needs DISCORD_TOKEN; workers run apart (`animegamer worker`)."""

from __future__ import annotations

import argparse
import logging
import sys

from animegamer.settings import Settings

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

    settings.data_dir.mkdir(parents=True, exist_ok=True)  # the embedded queue's files and the clips live there
    bot = AnimeGamerBot(settings)
    try:
        # One handler, the CLI's: one line per event (discord.py's own would print each line twice, coloured).
        logging.getLogger().setLevel(logging.INFO)
        bot.run(settings.discord_token.get_secret_value(), log_handler=None)
    except discord.LoginFailure:
        print("Discord refused DISCORD_TOKEN: it is wrong or was reset; copy a fresh one.", file=sys.stderr)
        return 1
    return 0
