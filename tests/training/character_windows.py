"""Small phase (b) samples for the published architecture's tests: windows of 1..3 turns of two episodes."""

from __future__ import annotations

import torch

from game.state import StateDeltas
from training.character_phase_b import Turn

LINES = [
    "Character: Mika; Motion: quickly run; Background: day beach.",
    "Character: Mika; Motion: sit on the sand; Background: sunset beach.",
    "Character: Mika; Motion: happily read a book; Background: room.",
]


def windows(n_query: int, width: int) -> list[list[Turn]]:
    """Two episodes of three turns; every turn with its earlier ones, so windows of 1, 2 and 3 turns. Each line's
    representation is one random vector at every position, the same in both episodes: learnable from the prompt."""
    g = torch.Generator().manual_seed(0)
    vectors = torch.randn(len(LINES), 1, width, generator=g)
    episodes = []
    for episode in range(2):
        turns = [
            Turn(
                instruction=line,
                deltas=StateDeltas(motion=3 - i, social=episode - 1, entertainment=i, stamina=-i - episode),
                representation=vectors[i].expand(n_query, width),
            )
            for i, line in enumerate(LINES)
        ]
        episodes.append(turns)
    return [turns[: end + 1] for turns in episodes for end in range(len(turns))]
