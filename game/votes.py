"""The rules of a vote round: who may change what, and which proposal wins."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

MAX_PROPOSALS = 10  # a round's buttons: two rows of five
MIN_ROUND_MINUTES, MAX_ROUND_MINUTES, DEFAULT_ROUND_MINUTES = 1, 60, 3


def tally(proposals: Sequence[int], votes: Iterable[int]) -> list[tuple[int, int]]:
    """``(proposal, votes)`` for every proposal in the order they were made, from each member's one vote."""
    counted = Counter(votes)
    return [(proposal, counted[proposal]) for proposal in proposals]


def winner(counts: Sequence[tuple[int, int]]) -> int | None:
    """Of ``tally``'s ``(proposal, votes)``, the proposal with the most votes; a tie goes to the earliest proposal
    (so does a round nobody voted in). None when there is nothing to play."""
    if not counts:
        return None
    most = max(votes for _, votes in counts)
    return next(proposal for proposal, votes in counts if votes == most)
