"""A worker's result, built in one place for the tests of the layers that store, move and post it."""

from __future__ import annotations

from typing import Any

from game.contract import TurnResult
from game.safety import SafetyReport
from game.state import StateDeltas


def turn_result(job_id: int | str = 1, **fields: Any) -> TurnResult:
    """A small valid result for ``job_id``: +1 motion, social and entertainment, -1 stamina, an empty clip and a
    one-frame 8 x 8 size, checked and clean; ``fields`` replace any of them."""
    values: dict[str, Any] = {
        "job_id": str(job_id),
        "model": "tiny",
        "label": "",
        "seed": 7,
        "deltas": StateDeltas(motion=1, social=1, entertainment=1, stamina=-1),
        "flow": 0.5,
        "mp4": b"",
        "representation": b"rep",
        "num_frames": 1,
        "height": 8,
        "width": 8,
        "fps": 8,
        "safety": SafetyReport(detector="test", scores={"FACE_FEMALE": 0.9}, frames=1),
    }
    return TurnResult(**(values | fields))


def report(**scores: float) -> SafetyReport:
    """A detector report over a 17-frame clip with these scores (label -> highest score)."""
    return SafetyReport(detector="test", scores=scores, frames=17)
