"""`animegamer data`: the data sets the training phases learn from.

- ``toyworld``: render the procedural toy world (no downloads);
- ``check``: validate a folder of your own clips and its annotations.jsonl, naming every bad line;
- ``prepare``: the same check, then each clip cut and resampled to the model's frames (``training.own_clips``).
"""

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
    toy.set_defaults(run=run)

    described = "FOLDER holds annotations.jsonl and the videos it names (docs/own-character.md has an example)."
    check = kinds.add_parser("check", help="validate your own clips and annotations.jsonl", description=described)
    check.add_argument("folder", type=Path, help="the folder with annotations.jsonl")
    check.set_defaults(run=run_check)
    prepare = kinds.add_parser(
        "prepare",
        help="check, then cut and resample your own clips into a data set the phases read",
        description=described + " Each clip becomes 17 frames at 8 fps from its start, cropped to the size's "
        "aspect and resized; nothing is written unless every line is good.",
    )
    prepare.add_argument("folder", type=Path, help="the folder with annotations.jsonl")
    prepare.add_argument("--out", type=Path, required=True, help="a new or empty folder to write")
    prepare.add_argument("--size", default="480x720", help="HEIGHTxWIDTH of the model's clips (default 480x720)")
    prepare.set_defaults(run=run_prepare)


def run_check(args: argparse.Namespace, settings: Settings) -> int:
    from training.own_clips import check

    report = check(args.folder)
    print(report, file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


def run_prepare(args: argparse.Namespace, settings: Settings) -> int:
    from tqdm import tqdm

    from training.dataset import DatasetError
    from training.own_clips import parse_size, prepare

    try:
        size = parse_size(args.size)
        with tqdm(unit="clip", desc="prepare", delay=0.2) as bar:
            prepared = prepare(args.folder, args.out, size, progress=bar.update)
    except (ValueError, DatasetError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"Wrote {prepared.episodes} episodes, {prepared.clips} clips at {size[0]}x{size[1]}, "
        f"{prepared.bytes / 1e6:.1f} MB to {prepared.out}"
    )
    return 0


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
