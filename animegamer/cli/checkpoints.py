"""`animegamer checkpoints check [DIR]`: every file the published model needs, before any GPU time.

For each character: the Mistral directory (tokenizer, config, weights), its MLLM, its decoder
(through `latest`), and the VAE; whether each is there and complete, every tensor found with
its shape, and the sizes found where they differ from the published ones. Only tensor shapes
are read, not the 25 GB of weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from animegamer.settings import Settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("checkpoints", help="check downloaded checkpoints", description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="list each expected file and whether it is usable")
    check.add_argument("directory", nargs="?", type=Path, help="the checkpoint root (default: ANIMEGAMER_CHECKPOINTS)")
    check.add_argument("--character", action="append", help="check only this character (repeatable)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from worker.pipeline.checkpoints.layout import CHARACTERS
    from worker.pipeline.checkpoints.load import check

    root = args.directory or settings.checkpoints
    reports = check(root, tuple(args.character or CHARACTERS))
    for report in reports:
        print(f"{report.character}: {'ready' if report.ok else 'not ready'}")
        print("\n".join(report.lines))
    playable = [r.character for r in reports if r.ok]
    print(f"\nPlayable: {', '.join(playable)}." if playable else f"\nNothing playable under {root}.")
    return 0 if playable else 1
