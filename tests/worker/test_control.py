"""Claims are leases: a worker frozen past its lease loses its turn to another and learns so at its next renewal,
and ending a claim never ends another worker's. On both stores the claims live in: Redis and SQL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.control import ENDED, Claim, Holder, JobControl, RedisControl, SqlControl
from tests import tiers

LEASE = 0.2  # seconds


@pytest.fixture(params=["sql", pytest.param("redis", marks=tiers.SLOW)])
def control(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobControl]:
    if request.param == "redis":
        made: JobControl = RedisControl(request.getfixturevalue("redis_url"), timeout=3.0)
    else:
        made = SqlControl(f"sqlite:///{tmp_path / 'results.db'}", timeout=3.0)
    yield made
    made.close()


@pytest.fixture
def task() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"  # the shared Redis keeps other tests' claims


def taken_over(control: JobControl, task: str) -> None:
    """Worker A claims ``task`` and then stops renewing for longer than its lease; worker B claims it."""
    assert control.claim(task, "A", LEASE) is Claim.CLAIMED
    time.sleep(LEASE * 2)
    assert control.claim(task, "B", 30.0) is Claim.CLAIMED


def test_a_worker_whose_claim_another_took_learns_it_lost_it_when_it_renews(control, task):
    taken_over(control, task)
    assert control.renew([task], "A", 30.0) == {task}
    assert control.renew([task], "B", 30.0) == set()


def test_ending_a_claim_never_ends_another_workers(control, task):
    taken_over(control, task)
    assert control.end(task, "A", keep=60.0) is False
    assert control.holders([task]) == {task: Holder.HELD}
    assert control.end(task, "B", keep=60.0) is True
    assert control.holders([task]) == {task: Holder.ENDED}


def test_a_claim_the_store_forgot_is_made_again_by_its_worker(control, task):
    """A Redis restarted without persistence forgets every claim: the worker still computing keeps its turn."""
    assert control.claim(task, "A", 30.0) is Claim.CLAIMED
    assert control.release(task, "A")  # what a forgetful store looks like: no record at all
    assert control.renew([task], "A", 30.0) == set()
    assert control.holders([task]) == {task: Holder.HELD}


def test_a_release_by_a_reader_of_an_old_holder_never_deletes_the_claim_another_worker_took_since(control, task):
    """A stopping worker A paused past its lease, or a bot that read "ended, no result" before another process
    handed the turn back: B holds the turn now, and neither release may delete B's claim."""
    taken_over(control, task)
    assert control.release(task, "A") is False
    assert control.release(task, ENDED) is False
    assert control.holders([task]) == {task: Holder.HELD}
    assert control.renew([task], "B", 30.0) == set()


def test_a_stopping_workers_release_lets_the_next_delivery_claim_the_turn_at_once(control, task):
    assert control.claim(task, "A", 30.0) is Claim.CLAIMED
    assert control.release(task, "A") is True
    assert control.claim(task, "B", 30.0) is Claim.CLAIMED


def test_an_ended_claim_whose_result_was_lost_is_released_for_the_turn_to_be_sent_again(control, task):
    assert control.claim(task, "A", 30.0) is Claim.CLAIMED
    assert control.end(task, "A", keep=60.0)
    assert control.claim(task, "B", 30.0) is Claim.TAKEN
    assert control.release(task, ENDED) is True
    assert control.claim(task, "B", 30.0) is Claim.CLAIMED
