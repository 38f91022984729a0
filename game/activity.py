"""A player's favourite actions, from the instructions of the turns they played."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from game.instruction import InstructionError, parse


def favourite_actions(lines: Iterable[str], count: int = 3) -> list[tuple[str, int]]:
    """The ``count`` actions played most (whatever the adverb: "gently fly" and "quickly fly" are one action), with
    how often; ties go to the name first in the alphabet. Lines that no longer parse are skipped."""
    actions: Counter[str] = Counter()
    for line in lines:
        try:
            actions[parse(line).action.casefold()] += 1
        except InstructionError:
            continue
    return sorted(actions.items(), key=lambda item: (-item[1], item[0]))[:count]
