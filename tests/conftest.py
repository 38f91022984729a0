"""Shared fixtures: one worker per broker and one tiny pipeline, each started once per test process; and the
two tiers (``tests/tiers.py``): a test that uses a slow fixture is marked slow as it is collected."""

from __future__ import annotations

import asyncio
import io
import signal
from collections.abc import Iterator

import pytest
import pytest_timeout

from tests import tiers
from tests.postgres_server import PostgresServer
from tests.redis_server import RedisServer
from tests.scrape import free_port
from tests.workers import SHARED_STEPS, Worker, redis_url_or_skip, start_worker, worker_env


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.longest_first(items)
    for item in items:
        if tiers.SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(tiers.SLOW)
        # make test's report says each test's tier (scripts/tier_summary.py)
        item.user_properties.append(("tier", "slow" if item.get_closest_marker("slow") else "fast"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    RedisServer.stop_all()  # a test's own servers daemonize: none outlives the run
    PostgresServer.stop_all()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of the test, module- and session-scoped ones included: a fast-tier test that starts a
    worker or a server then fails loudly (``tiers.starting``)."""
    tiers.running(None if item.get_closest_marker("slow") else item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    tiers.running(None)  # fixtures torn down now (a session's servers after its last test) stop, never start


def _with_asyncio_tasks(dump_threads):
    """pytest-timeout prints every thread's stack, where an async test's hang shows only as the event loop's idle
    poll: print each asyncio task's stack too, which names the await that never returned."""

    def dump_stacks(terminal) -> None:
        dump_threads(terminal)
        loop = asyncio._get_running_loop()  # the test's loop, interrupted by the alarm in its poll
        for task in asyncio.all_tasks(loop) if loop is not None else ():
            terminal.sep("~", title=f"asyncio task {task.get_name()}")
            stack = io.StringIO()
            task.print_stack(file=stack)
            terminal.write(stack.getvalue())

    return dump_stacks


pytest_timeout.dump_stacks = _with_asyncio_tasks(pytest_timeout.dump_stacks)


@pytest.fixture(scope="session")
def sqlite_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    # Its metrics endpoint too, on a port of its own (tests/worker/test_metrics.py scrapes it).
    metrics = {"ANIMEGAMER_WORKER_METRICS_PORT": str(free_port()), "ANIMEGAMER_METRICS_ADDRESS": "127.0.0.1"}
    worker = start_worker(worker_env(tmp_path_factory.mktemp("sqlite-worker"), **metrics, **SHARED_STEPS))
    yield worker
    worker.kill(signal.SIGTERM)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The shared Redis the tests may use (skipped, with the reason, where none answers)."""
    return redis_url_or_skip()


@pytest.fixture(scope="session")
def redis_worker(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Worker]:
    metrics = {"ANIMEGAMER_WORKER_METRICS_PORT": str(free_port()), "ANIMEGAMER_METRICS_ADDRESS": "127.0.0.1"}
    worker = start_worker(worker_env(tmp_path_factory.mktemp("redis-worker"), redis_url, **metrics, **SHARED_STEPS))
    yield worker
    worker.kill(signal.SIGTERM)


@pytest.fixture(scope="session")
def tiny_pipeline():
    """One tiny pipeline for every in-process test that needs the model."""
    from worker.pipeline.loading import load_pipeline

    return load_pipeline("tiny", device="cpu")
