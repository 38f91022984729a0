"""`animegamer demo`: play the release's demo story as one game, through the real queue.

Writes out/turn_01.mp4 ... and out/story.html. Files from an earlier run are removed first and
every clip is written atomically, so after Ctrl-C what is on disk is complete and the page
says how far the story got.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from importlib.resources import files
from pathlib import Path

from tqdm import tqdm

from animegamer.local_game import (
    LocalGame,
    SetupError,
    TurnFailed,
    WorkerProcess,
    bar_progress,
    connect,
    run_turn,
    write_atomically,
)
from animegamer.story_page import StoryRow, render_story
from game.instruction import Instruction, InstructionError, parse
from relay.settings import Settings

PAGE = "story.html"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="play the demo story and write clips and a story page", description=__doc__)
    parser.add_argument("--instructions", type=Path, help="a file of instructions, one per line (default: the demo)")
    parser.add_argument("--out", type=Path, default=Path("out"), help="where clips and story.html go (default out/)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first turn (default 0)")
    parser.add_argument(
        "--no-worker", action="store_true", help="use workers already serving the broker instead of starting one"
    )
    parser.set_defaults(run=run)


def load_instructions(path: Path | None) -> list[Instruction]:
    """Every line is checked before any work starts; blank lines and # comments are skipped."""
    text = path.read_text(encoding="utf-8") if path else (files("game") / "data" / "demo.txt").read_text("utf-8")
    instructions, errors = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            instructions.append(parse(line))
        except InstructionError as exc:
            errors.append(f"line {number}: {exc}")
    if errors:
        raise InstructionError("; ".join(errors))
    if not instructions:
        raise InstructionError("The file holds no instructions.")
    return instructions


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        instructions = load_instructions(args.instructions)
    except (OSError, InstructionError) as exc:
        print(f"Cannot play {args.instructions or 'the demo'}: {exc}", file=sys.stderr)
        return 2

    try:
        app = connect(settings)
    except SetupError as exc:
        print(exc, file=sys.stderr)
        return 1

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("turn_*.mp4"), out / PAGE]:
        stale.unlink(missing_ok=True)

    game = LocalGame(settings, seed=args.seed)
    rows: list[StoryRow] = []
    label = ""

    def write_page(status: str) -> None:
        page = render_story(rows, title="AnimeGamer demo", model=settings.model, label=label, status=status)
        write_atomically(out / PAGE, page.encode())

    total = len(instructions)
    local_worker = nullcontext() if args.no_worker else WorkerProcess(settings, settings.data_dir / "worker.log")
    try:
        with local_worker as worker, tqdm(total=total, desc="turns", unit="turn", position=0) as turns_bar:
            for number, instruction in enumerate(instructions, start=1):
                with tqdm(total=1, desc=f"turn {number}: queued", unit="step", position=1, leave=False) as steps:
                    progress = bar_progress(steps, f"turn {number}: ")
                    request = game.request(instruction)
                    result = run_turn(
                        app,
                        game.blobs,
                        request,
                        game.queue(instruction),
                        progress,
                        worker,
                        settings.task_time_limit + 60,
                    )
                clip = f"turn_{number:02d}.mp4"
                write_atomically(out / clip, result.mp4)
                label = result.label
                state = game.apply(instruction, result)
                rows.append(
                    StoryRow(number, str(instruction), clip, result.deltas, state, sum(result.timings.values()))
                )
                write_page(f"Playing: {number} of {total} turns done.")
                tqdm.write(
                    f"turn {number}: {instruction}  stamina {state.stamina} social {state.social} "
                    f"entertainment {state.entertainment}" + (f"  [{label}]" if label else "")
                )
                turns_bar.update()
    except KeyboardInterrupt:
        for partial in out.glob(".*.partial"):
            partial.unlink()
        write_page(f"Stopped after {len(rows)} of {total} turns.")
        print(f"\nStopped after {len(rows)} of {total} turns; the worker was stopped.", file=sys.stderr)
        return 130
    except TurnFailed as exc:
        write_page(f"Failed at turn {len(rows) + 1} of {total}.")
        print(exc, file=sys.stderr)
        return 1
    write_page(f"Complete: {total} turns.")
    print(f"Wrote {total} clips and {out / PAGE}" + (f" ({label})." if label else "."))
    return 0
