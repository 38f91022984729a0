"""Shared fixtures: one worker per broker and one tiny pipeline, each started once per session."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.scrape import free_port
from tests.workers import Worker, redis_url_or_skip, start_worker, worker_env


@pytest.fixture(scope="session")
def sqlite_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    # Its metrics endpoint too, on a port of its own (tests/worker/test_metrics.py scrapes it).
    metrics = {"ANIMEGAMER_WORKER_METRICS_PORT": str(free_port()), "ANIMEGAMER_METRICS_ADDRESS": "127.0.0.1"}
    worker = start_worker(worker_env(tmp_path_factory.mktemp("sqlite-worker"), **metrics))
    yield worker
    worker.kill(signal.SIGTERM)


@pytest.fixture(scope="session")
def redis_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    worker = start_worker(worker_env(tmp_path_factory.mktemp("redis-worker"), redis_url_or_skip()))
    yield worker
    worker.kill(signal.SIGTERM)


@pytest.fixture(scope="session")
def tiny_pipeline():
    """One tiny pipeline for every in-process test that needs the model."""
    from worker.pipeline.pipeline import load_pipeline

    return load_pipeline("tiny", device="cpu")
