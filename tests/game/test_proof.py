"""A result is proved with its own turn's ticket: any field the bot acts on, changed, and the proof no longer holds."""

from __future__ import annotations

import pytest

from game.contract import BlobRef
from game.proof import proof_of, proved, ticket_for
from game.safety import SafetyReport
from game.state import StateDeltas
from tests.results import turn_result

SECRET = b"the game's own secret"


def result(**changes: object):
    made = turn_result(
        "7", label="", deltas=StateDeltas(motion=1, social=2, entertainment=3, stamina=-4), flow=1.5,
        mp4=BlobRef(sha256="a" * 64, size=1000), representation=b"rep", num_frames=17, height=64, width=96,
    )  # fmt: skip
    return made.model_copy(update=changes)


def signed(made, task_id: str = "task-7"):
    return made.model_copy(update={"proof": proof_of(ticket_for(SECRET, task_id), made)})


def test_a_result_proved_with_its_turns_ticket_holds_and_its_timings_are_free() -> None:
    made = signed(result())
    assert proved(made, SECRET, "task-7")
    assert proved(made.model_copy(update={"timings": {"denoise": 9.0}}), SECRET, "task-7")


def test_another_turns_ticket_or_another_games_secret_proves_nothing() -> None:
    made = signed(result())
    assert not proved(made, SECRET, "task-8")
    assert not proved(made, b"another game's secret", "task-7")
    assert not proved(result(), SECRET, "task-7")  # no proof at all


@pytest.mark.parametrize(
    "change",
    [
        {"mp4": BlobRef(sha256="b" * 64, size=1000)},
        {"deltas": StateDeltas(motion=1, social=2, entertainment=3, stamina=4)},
        {"job_id": "8"},
        {"representation": b"another"},
    ],
)
def test_a_field_changed_after_the_proof_breaks_it(change: dict) -> None:
    made = signed(result())
    assert not proved(made.model_copy(update=change), SECRET, "task-7")


def test_a_cleaner_safety_report_than_the_detector_gave_breaks_it() -> None:
    made = signed(result(safety=SafetyReport(detector="test", scores={"FEMALE_BREAST_EXPOSED": 0.97}, frames=17)))
    cleaned = SafetyReport(detector="test", scores={"FEMALE_BREAST_EXPOSED": 0.01}, frames=17)
    assert not proved(made.model_copy(update={"safety": cleaned}), SECRET, "task-7")
