"""`animegamer data toyworld`: render the procedural toy-world data set the training phases learn from."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from animegamer.cli.arguments import positive
from relay.settings import Settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("data", help="write training data sets", description=__doc__)
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    toy = kinds.add_parser(
        "toyworld",
        help="render toy-world episodes (no downloads): clips, instructions, state changes",
        description="Renders episodes of 1..5 turns (17 frames at 64x96 each) with their instructions and "
        "ground-truth state changes into a new folder; manifest.json is written last.",
    )
    toy.add_argument("--out", type=Path, required=True, help="a new or empty folder to write")
    toy.add_argument("--clips", type=positive, required=True, help="how many clips (turns) to render")
    toy.add_argument("--seed", type=int, default=0, help="the same seed writes the same data set (default 0)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from tqdm import tqdm

    from training.dataset import DatasetError, write_toyworld

    started = time.perf_counter()
    try:
        with tqdm(total=args.clips, unit="clip", desc="toyworld", delay=0.2) as bar:
            manifest = write_toyworld(args.out, args.clips, seed=args.seed, progress=bar.update)
    except DatasetError as exc:
        print(exc, file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    print(
        f"Wrote {manifest.episodes} episodes, {manifest.clips} clips "
        f"({manifest.frames} frames at {manifest.height}x{manifest.width}), "
        f"{manifest.bytes / 1e6:.1f} MB in {seconds:.1f} s to {args.out}"
    )
    return 0
