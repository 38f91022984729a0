"""How well a served character's states follow its annotations: each episode played as the game plays it.

Every annotated episode of a prepared data set goes through the pipeline's MLLM turn by turn, each turn's history
holding the model's own earlier predictions (its states and representations), as a player's turns do. The figure is
the predicted state changes (motion level, social, entertainment, stamina) against the annotated ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from game.contract import HistoryTurn, TurnRequest
from game.state import StateDeltas
from training.dataset import EPISODES, MAX_TURNS

FIELDS = ("motion", "social", "entertainment", "stamina")


@dataclass(frozen=True)
class StateFigure:
    turns: int
    mean_abs_error: float  # over all four values of every turn, in state points (-5..5)
    exact: float  # share of the values predicted exactly

    def __str__(self) -> str:
        return f"{self.turns} turns: mean |error| {self.mean_abs_error:.2f} points, {self.exact:.0%} of values exact"


def states_against_annotations(pipeline, data: Path) -> StateFigure:  # pipeline: AnimeGamerPipeline
    """Play every episode of ``data`` (``animegamer data prepare``'s folder) through ``pipeline.think``."""
    errors: list[int] = []
    for line in (Path(data) / EPISODES).read_text().splitlines():
        history: list[HistoryTurn] = []
        for turn in json.loads(line)["turns"]:
            request = TurnRequest(
                job_id="eval", instruction=turn["instruction"], seed=0, history=history[-(MAX_TURNS - 1) :]
            )
            predicted, representation = pipeline.think(request)
            wanted = StateDeltas(**turn["deltas"])
            errors += [abs(getattr(predicted, f) - getattr(wanted, f)) for f in FIELDS]
            bytes_ = pipeline.representation_bytes(representation[0])
            history.append(HistoryTurn(instruction=turn["instruction"], representation=bytes_, deltas=predicted))
    if not errors:
        raise ValueError(f"{data} holds no turns")
    return StateFigure(len(errors) // len(FIELDS), sum(errors) / len(errors), errors.count(0) / len(errors))
