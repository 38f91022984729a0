"""The two tiers of the suite: ``make check`` runs the tests that need no process or server of their own
(``-m "not slow"``), ``make test`` runs them all.

A test is slow because of what it uses, never because someone remembered to mark it: the collection hook in
``tests/conftest.py`` marks every test that asks for one of ``SLOW_FIXTURES`` (directly or through another
fixture; a module's own such fixture says so with ``@slow_fixture``), and fixtures whose parameters start
servers mark those parameters (``pytest.param(..., marks=SLOW)``). What a test reaches at run time is checked
too: every helper that starts a worker, a Redis server or a connection to PostgreSQL or the shared Redis calls
``starting``, which fails a test of the fast tier, fixtures of any scope included. A test may also be marked
slow by hand for what it computes (a long re-encode), never to hide a process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

SLOW = pytest.mark.slow

# Fixtures that start a worker process or a server, or connect to PostgreSQL or Redis.
SLOW_FIXTURES = {"sqlite_worker", "redis_worker", "worker_settings", "redis_url"}

F = TypeVar("F", bound=Callable[..., Any])


def slow_fixture(fixture: F) -> F:
    """Put under ``@pytest.fixture``: every test that uses this fixture is in the slow tier."""
    SLOW_FIXTURES.add(fixture.__name__)
    return fixture


_fast_test: str | None = None  # the node id of the fast-tier test running now, if one is


def running(node_id: str | None) -> None:
    """Called before each test's fixtures are set up: the id of a fast-tier test, or None for a slow one."""
    global _fast_test
    _fast_test = node_id


def starting(what: str) -> None:
    """Refuse ``what`` (a worker, a server, a connection) inside a fast-tier test."""
    if _fast_test is not None:
        pytest.fail(
            f"{_fast_test} starts {what}, which the fast tier (make check) never does: "
            f"ask for one of {sorted(SLOW_FIXTURES)}, "
            "or mark the fixture @tiers.slow_fixture or its parameter tiers.SLOW",
            pytrace=False,
        )


# The test files that take longest (seconds of test time, setup included, measured on the 2-core machine), longest
# first. They are collected first, and xdist (--dist loadfile --no-loadscope-reorder) hands files out in collection
# order, so the long ones start first and the last file to end is a short one: handed out in name order, the fleet's
# 470 s in one file started a third of the way in and the slow tier waited for it alone at the end. Re-measured
# from a ci-local run's reports (out/tiers/*.xml) when a file grows.
LONGEST_FIRST = (
    "tests/bot/test_faults.py",  # 250 s
    "tests/bot/test_fleet_takeover.py",  # 155 s
    "tests/training/test_character_run.py",  # 147 s
    "tests/bot/test_fleet_shared.py",  # 119 s
    "tests/bot/test_fleet.py",  # 95 s
    "tests/bot/test_fleet_pauses.py",  # 78 s
    "tests/bot/test_redis_outage.py",  # 77 s
    "tests/worker/test_queue.py",  # 76 s
    "tests/worker/test_metrics.py",  # 54 s
    "tests/bot/test_rogue_results.py",  # 50 s
    "tests/cli/test_demo.py",  # 47 s
    "tests/bot/test_workers_anywhere.py",  # 45 s
    "tests/pipeline/test_benchmark_scripts.py",  # 43 s
    "tests/bot/test_load.py",  # 42 s
    "tests/bot/test_s3_clips.py",  # 41 s
    "tests/worker/test_safety.py",  # 39 s
    "tests/training/test_phase_b.py",  # 35 s
    "tests/bot/test_admin.py",  # 35 s
    "tests/bot/test_story.py",  # 34 s
    "tests/test_redis_acl.py",  # 31 s
    "tests/training/test_character_phase_b.py",  # 30 s
    "tests/worker/test_time_limits.py",  # 29 s
    "tests/training/test_phase_a.py",  # 29 s
    "tests/bot/test_recaps.py",  # 29 s
    "tests/bot/test_metrics.py",  # 29 s
    "tests/bot/test_backup_restore.py",  # 29 s
)


def longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: the files of ``LONGEST_FIRST`` first, in its order, then the rest as collected."""
    rank = {path: place for place, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
