"""What to suggest while a player types a motion or a background: what the model knows, and what the server plays.

A new player does not know which instructions a model draws well. The model knows what it was trained on: the
toy model the toy world's actions, adverbs, places and times (``game/data/toy_vocabulary.json``, written from
``training.toyworld``, a test keeps the two equal), the published model the release's demo instructions
(``game/data/demo.txt``). A server's own most played motions and backgrounds come first: what friends play is
what a player wants to try next. Suggestions only help; the command still checks whatever is typed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from game.instruction import MAX_FIELD_CHARS, InstructionError, parse

DATA = Path(__file__).parent / "data"
TOY_VOCABULARY = DATA / "toy_vocabulary.json"
DEMO = DATA / "demo.txt"
RELEASE_MODEL = "animegamer"  # the published model's name in settings (relay.celery_app.RELEASE_MODEL)
MAX_CHOICES = 25  # Discord shows at most 25 autocomplete choices


@dataclass(frozen=True)
class Vocabulary:
    """The motions and backgrounds a model was trained on, in the order to offer them."""

    motions: tuple[str, ...]
    backgrounds: tuple[str, ...]


@cache
def vocabulary_for(model: str) -> Vocabulary:
    """The published model knows its demo's lines; the toy model (and the random ``tiny``, same grammar) the toy
    world's."""
    if model == RELEASE_MODEL:
        lines = [parse(line) for line in DEMO.read_text().splitlines() if line.strip()]
        return Vocabulary(_distinct(i.motion for i in lines), _distinct(i.background for i in lines))
    data = json.loads(TOY_VOCABULARY.read_text())
    return Vocabulary(tuple(data["motions"]), tuple(data["backgrounds"]))


def most_played(lines: Iterable[tuple[str, int]]) -> tuple[list[str], list[str]]:
    """Motions and backgrounds, most played first, from ``(instruction line, times played)``; lines that no longer
    parse (the grammar grew stricter) are skipped."""
    motions: Counter[str] = Counter()
    backgrounds: Counter[str] = Counter()
    for line, count in lines:
        try:
            instruction = parse(line)
        except InstructionError:
            continue
        motions[instruction.motion.casefold()] += count
        backgrounds[instruction.background.casefold()] += count
    return _ranked(motions), _ranked(backgrounds)


def suggest(typed: str, played: Sequence[str], known: Sequence[str], limit: int = MAX_CHOICES) -> list[str]:
    """Up to ``limit`` suggestions holding every word typed: the server's most played first, then what the model
    knows; within each, those with words that start as typed before those that only contain it."""
    words = typed.casefold().split()
    offered: dict[str, str] = {}  # folded -> as offered
    for group in (played, known):
        ranked = sorted((rank, index) for index, text in enumerate(group) if (rank := _rank(text, words)) is not None)
        for _, index in ranked:
            text = group[index]
            if len(text) <= MAX_FIELD_CHARS:
                offered.setdefault(text.casefold(), text)
    return list(offered.values())[:limit]


def _rank(text: str, words: list[str]) -> int | None:
    folded = text.casefold()
    if not all(word in folded for word in words):
        return None
    pieces = folded.split()
    return 0 if all(any(piece.startswith(word) for piece in pieces) for word in words) else 1


def _ranked(counts: Counter[str]) -> list[str]:
    return [text for text, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def _distinct(texts: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(texts))
