"""A turn's time limits, on real worker processes whose pipeline misbehaves (tests/faulty_worker.py)."""

from __future__ import annotations

import time

import pytest

from relay.control import Holder, control_for
from tests.scrape import free_port, probe_until
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


def test_a_turn_stuck_with_no_step_gives_its_claim_up_and_fails_livez_long_before_its_time_limit(tmp_path):
    """A turn stuck in a call that never returns (``hang``): its worker stops renewing the claim once the turn has
    reported no step for ANIMEGAMER_WORKER_STALL_SECONDS, so the claim lapses for the bot to hand the turn on, and
    /livez fails naming the turn, while the hard time limit is still a minute away."""
    port = free_port()
    env = worker_env(
        tmp_path,
        ANIMEGAMER_TASK_TIME_LIMIT="90",
        ANIMEGAMER_WORKER_STALL_SECONDS="3",
        ANIMEGAMER_CLAIM_SECONDS="3",
        ANIMEGAMER_WORKER_METRICS_PORT=str(port),
        ANIMEGAMER_METRICS_ADDRESS="127.0.0.1",
    )
    worker = start_worker(env, module="tests.faulty_worker")
    control = control_for(worker.app.conf.result_backend, timeout=5)
    try:
        assert probe_until(port, "livez", 200)["stuck"] == []  # idle: live
        turn = worker.send_turn("Character: Qiqi; Motion: hang; Background: town.", "stall")
        dead = probe_until(port, "livez", 503)
        deadline = time.monotonic() + 30
        while control.holders([turn.id])[turn.id] is not Holder.ABSENT:  # renewed no more: lapsed
            assert time.monotonic() < deadline, worker.log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        lapsed_while_running = worker.said("Hard time limit") == 0
    finally:
        control.close()
        worker.kill()
    assert dead["stuck"][0].startswith(f"turn {turn.id} has reported no step for"), dead
    assert lapsed_while_running
    told = worker.log.read_text(errors="replace")
    assert "its claim is no longer renewed" in told and "misbehave_on_request" in told  # the stuck thread's stack
