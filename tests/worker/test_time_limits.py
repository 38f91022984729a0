"""A turn's time limits, on real worker processes whose pipeline misbehaves (tests/faulty_worker.py)."""

from __future__ import annotations

import pytest

from tests.workers import Worker, start_worker, worker_env

pytestmark = pytest.mark.slow


def play(worker: Worker, motion: str, timeout: float = 90):
    return worker.send_turn(f"Character: Qiqi; Motion: {motion}; Background: town.", "limit").get(timeout=timeout)


def test_a_soft_limit_landing_while_progress_is_stored_ends_the_turn_with_its_message(tmp_path):
    worker = start_worker(worker_env(tmp_path, ANIMEGAMER_TASK_TIME_LIMIT="20"), module="tests.faulty_worker")
    try:
        with pytest.raises(Exception) as failed:
            play(worker, "dawdle")  # 50 steps, each progress write stalling 1 s: the soft limit (10 s) lands in one
        done = play(worker, "gently wave")
    finally:
        worker.kill()
    assert type(failed.value).__name__ == "TurnTooLong", failed.value  # not the hard limit's kill at 20 s
    assert "soft time limit (10 s)" in str(failed.value)
    assert done["job_id"].startswith("limit-")
    assert worker.said("Hard time limit") == 0  # no child was killed
