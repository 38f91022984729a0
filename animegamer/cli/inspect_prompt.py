"""`animegamer inspect-prompt`: the MLLM prompt's token ids for one instruction, as JSON on one line.

The ids are exactly what a worker feeds the MLLM (the instruction in canonical form, past turns
oldest first), so they can be compared with the release's tokenizer without a GPU or weights.
DIR is a folder holding tokenizer.model: a Hugging Face Mistral-7B-Instruct-v0.1 directory or the
release's animegamer_tokenizer folder. A history file holds past turns, oldest first, as JSON lines
or one JSON list of {"instruction": "...", "deltas": {"motion": m, "social": s, "entertainment": e,
"stamina": t}}; representations do not change ids and are not read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from game.contract import HistoryTurn
from game.history import MAX_WINDOW
from game.instruction import InstructionError, parse
from game.state import StateDeltas
from relay.settings import Settings

EXIT_BAD_INPUT = 2  # the same code argparse uses for a bad command line
EXIT_NO_TOKENIZER = 1


class HistoryFileError(ValueError):
    """A history file that cannot be read as past turns; the message names the file and the entry."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "inspect-prompt",
        help="print the MLLM prompt's token ids for an instruction",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--tokenizer", type=Path, required=True, metavar="DIR", help="a directory holding tokenizer.model"
    )
    parser.add_argument(
        "--history-file", type=Path, metavar="F", help="past turns, oldest first (JSON lines or a JSON list)"
    )
    parser.add_argument("instruction", help='e.g. "Character: Qiqi; Motion: gently lie down; Background: day grass."')
    parser.set_defaults(run=run)


def _history_entries(path: Path) -> list[tuple[str, Any]]:
    """(where, entry) pairs from a JSON list or from JSON lines, where = "F entry N" or "F line N"."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise HistoryFileError(f"cannot read the history file {path}: {exc.strerror or exc}") from exc
    if text.lstrip().startswith("["):
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HistoryFileError(f"{path}: not a JSON list ({exc})") from exc
        return [(f"{path} entry {number}", entry) for number, entry in enumerate(entries, start=1)]
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            found.append((f"{path} line {number}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise HistoryFileError(f"{path} line {number}: not JSON ({exc.msg})") from exc
    return found


def load_history(path: Path) -> list[HistoryTurn]:
    """Past turns checked as strictly as a worker checks a job: canonical instructions, deltas -5..5."""
    turns = []
    for where, entry in _history_entries(path):
        if not isinstance(entry, dict) or "instruction" not in entry or "deltas" not in entry:
            raise HistoryFileError(f'{where}: expected {{"instruction": "...", "deltas": {{...}}}}')
        try:
            instruction = str(parse(entry["instruction"]))
        except InstructionError as exc:
            raise HistoryFileError(f"{where}: {exc}") from exc
        try:
            deltas = StateDeltas.model_validate(entry["deltas"])
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'deltas'}: {e['msg']}" for e in exc.errors())
            raise HistoryFileError(
                f"{where}: deltas need motion, social, entertainment and stamina, each -5..5 ({problems})"
            ) from exc
        turns.append(HistoryTurn(instruction=instruction, representation=b"", deltas=deltas))
    if len(turns) > MAX_WINDOW - 1:
        raise HistoryFileError(f"{path} holds {len(turns)} past turns; a prompt holds at most {MAX_WINDOW - 1}")
    return turns


def run(args: argparse.Namespace, settings: Settings) -> int:
    # 1. The player's input first: it is cheap to check and needs no files
    try:
        instruction = str(parse(args.instruction))
        history = load_history(args.history_file) if args.history_file else []
    except (InstructionError, HistoryFileError) as exc:
        print(f"Cannot build the prompt: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    # 2. The tokenizer; imported here so that bad input is reported without loading the model stack
    from worker.pipeline.prompt import build_prompt
    from worker.pipeline.tokenizer import AnimeGamerTokenizer

    try:
        tokenizer = AnimeGamerTokenizer.from_checkpoint_dir(args.tokenizer)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"Cannot load the tokenizer: {exc}", file=sys.stderr)
        return EXIT_NO_TOKENIZER

    # 3. The ids, one JSON line on stdout so that other tools can read them
    print(json.dumps(build_prompt(tokenizer, instruction, history).ids))
    return 0
