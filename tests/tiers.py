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
