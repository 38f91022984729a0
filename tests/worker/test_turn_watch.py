"""What a worker's /livez and its heartbeat read (worker/liveness.py): a turn silent for the stall limit is stalled,
a turn that steps is not, and a heartbeat round that runs for the limit is stuck."""

from __future__ import annotations

import logging
import time

import pytest

from worker.liveness import TurnWatch

LIMIT = 0.2


def test_a_turn_that_keeps_stepping_is_live() -> None:
    watch = TurnWatch(LIMIT)
    for _ in range(4):
        watch.stepped("t1")
        time.sleep(LIMIT / 4)
    live, report = watch.report()
    assert live and watch.stalled() == set() and report["stuck"] == []


def test_a_turn_silent_for_the_limit_is_stalled_and_its_stack_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    watch = TurnWatch(LIMIT)
    watch.stepped("t1")
    time.sleep(LIMIT * 1.5)
    with caplog.at_level(logging.ERROR, logger="worker.liveness"):
        first, second = watch.stalled(), watch.stalled()
    live, report = watch.report()
    assert first == second == {"t1"} and not live
    assert report["stuck"] == ["turn t1 has reported no step for 0 s"]
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 1 and "no longer renewed" in told[0] and "test_a_turn_silent_for_the_limit" in told[0]


def test_a_stalled_turn_that_steps_again_is_live_and_an_ended_one_forgotten() -> None:
    watch = TurnWatch(LIMIT)
    watch.stepped("t1")
    watch.stepped("t2")
    time.sleep(LIMIT * 1.5)
    watch.stepped("t1")
    watch.ended("t2")
    assert watch.stalled() == set() and watch.report()[0]


def test_a_heartbeat_round_running_for_the_limit_is_stuck() -> None:
    watch = TurnWatch(LIMIT)
    watch.round_began()
    time.sleep(LIMIT * 1.5)
    stuck = watch.report()
    watch.round_ended()
    assert not stuck[0] and stuck[1]["stuck"][0].startswith("the heartbeat's renewal has run for")
    assert watch.report()[0]
