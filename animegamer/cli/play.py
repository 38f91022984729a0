"""`animegamer play`: the game in a terminal. Type an instruction, get a clip and the new state.

Either a whole line (`Character: Qiqi; Motion: gently lie down; Background: day grass.`)
or, once a character is playing, just `motion; background` (`quickly run; night street`).
Commands: `status`, `help`, `quit`. Clips and a story page go to out/play/.
"""

from __future__ import annotations

import argparse
import sys
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
from game.instruction import EXPECTED_FORM, Instruction, InstructionError, from_fields, parse
from game.state import CharacterState
from relay.settings import Settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("play", help="play interactively in the terminal", description=__doc__)
    parser.add_argument("--character", default="Qiqi", help="who you play (default Qiqi)")
    parser.add_argument("--out", type=Path, default=Path("out/play"), help="where clips go (default out/play/)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first turn (default 0)")
    parser.set_defaults(run=run)


def read_instruction(line: str, character: str) -> Instruction:
    """A full instruction line, or the `motion; background` shorthand for the current character."""
    if line.lower().lstrip().startswith("character"):
        return parse(line)
    parts = line.split(";")
    if len(parts) != 2:
        raise InstructionError("Type `motion; background`, or a whole instruction line.")
    return from_fields(character, parts[0], parts[1].strip().rstrip("."))


def describe(state: CharacterState) -> str:
    return f"stamina {state.stamina}  social {state.social}  entertainment {state.entertainment}"


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        app = connect(settings)
    except SetupError as exc:
        print(exc, file=sys.stderr)
        return 1
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    game = LocalGame(settings, seed=args.seed)
    character = args.character
    rows: list[StoryRow] = []
    print(f"Starting a worker ({settings.model} model)... Type `help` for help, `quit` to stop.")
    with WorkerProcess(settings, settings.data_dir / "worker.log") as worker:
        while True:
            try:
                line = input(f"{character}> ").strip()
            except EOFError:
                break
            if not line:
                continue
            if line.lower() in {"quit", "exit", "q"}:
                break
            if line.lower() == "help":
                print(__doc__.strip().split("\n", 1)[1].strip(), f"\nExample: {EXPECTED_FORM}")
                continue
            if line.lower() == "status":
                print(f"{character}: {describe(game.state)}")
                continue
            try:
                instruction = read_instruction(line, character)
            except InstructionError as exc:
                print(exc)
                continue
            character = instruction.character
            with tqdm(total=1, desc="queued", unit="step", leave=False) as bar:
                try:
                    request, queue = game.request(instruction), game.queue(instruction)
                    result = run_turn(
                        app, game.blobs, request, queue, bar_progress(bar), worker, settings.task_time_limit + 60
                    )
                except TurnFailed as exc:
                    print(exc)
                    if not worker.alive():
                        return 1
                    continue
            number = len(rows) + 1
            clip = f"turn_{number:02d}.mp4"
            write_atomically(out / clip, result.mp4)
            state = game.apply(instruction, result)
            rows.append(StoryRow(number, str(instruction), clip, result.deltas, state, sum(result.timings.values())))
            page = render_story(rows, title="AnimeGamer", model=settings.model, label=result.label, status="")
            write_atomically(out / "story.html", page.encode())
            tag = f"  [{result.label}]" if result.label else ""
            tqdm.write(f"{out / clip}  {describe(state)}  (motion level {result.deltas.motion}){tag}")
    return 0
