"""`animegamer checkpoints check [DIR]`: every file the published model needs, before any GPU time.

For each character: the Mistral directory (tokenizer, config, weights), its MLLM, its decoder
(through `latest`), and the VAE; whether each is there and complete, every tensor found with
its shape, and the sizes found where they differ from the published ones. Only tensor shapes
are read, not the 25 GB of weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from relay.settings import Settings


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
    if playable:
        print_memory_plan(root, playable)
    return 0 if playable else 1


def print_memory_plan(root: Path, characters: list[str]) -> None:
    """GPU memory per stage for one character and for all, by placement (bf16; activations estimated)."""
    from worker.pipeline.checkpoints.layout import CheckpointLayout
    from worker.pipeline.checkpoints.load import found_config, memory_plan
    from worker.pipeline.memory import GIB, PLACEMENTS, Placement

    config = found_config(CheckpointLayout(root, characters[0]))
    print("\nGPU memory: bf16 weights counted exactly, activations estimated (GiB):")
    for group in [characters[:1], characters] if len(characters) > 1 else [characters]:
        needs = memory_plan(config, len(group))
        least = min(needs.peak(p) for p in PLACEMENTS) / GIB
        resident = needs.peak(Placement()) / GIB
        print(f"  {' and '.join(group)}: a GPU with {least:.1f} GiB free, {resident:.1f} to keep everything resident")
        print("\n".join(f"    {line}" for line in needs.table()))
