"""The `animegamer` command: one module per subcommand, each with `add_parser` and `run`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from animegamer.cli import bot, check, checkpoints, data, db, demo, inspect_prompt, play, privacy, train, worker
from relay.settings import get_settings, settings_at_odds, unreadable_url

COMMANDS = (demo, play, worker, bot, check, db, privacy, inspect_prompt, checkpoints, data, train)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="animegamer",
        description="AnimeGamer: language instructions in, anime clips and character state out.",
        epilog="Settings come from ANIMEGAMER_* environment variables or .env (see .env.example).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    if (problem := unreadable_url(settings) or settings_at_odds(settings)) is not None:
        print(problem, file=sys.stderr)
        return 2
    try:
        return args.run(args, settings)
    except KeyboardInterrupt:
        print("\nStopped.", file=sys.stderr)
        return 130
