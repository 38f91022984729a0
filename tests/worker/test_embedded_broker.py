"""The embedded (SQLite) broker's polling: quick while turns come, slow while none do (relay/sqlite_broker.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kombu import Consumer, Producer, Queue

from relay import sqlite_broker
from relay.celery_app import make_celery
from relay.settings import Settings


def polls_in(connection, seconds: float, counted: list[float]) -> int:
    """How many times the queue was asked within ``seconds`` of waiting with nothing to take."""
    before = len(counted)
    with pytest.raises(TimeoutError):
        connection.drain_events(timeout=seconds)
    return len(counted) - before


def test_an_idle_embedded_queue_is_asked_far_less_often_than_a_busy_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[float] = []
    real_get = sqlite_broker.Channel._get

    def counting_get(self, queue: str):
        counted.append(time.monotonic())
        return real_get(self, queue)

    monkeypatch.setattr(sqlite_broker.Channel, "_get", counting_get)
    monkeypatch.setattr(sqlite_broker.Transport, "IDLE_AFTER", 1.0)
    app = make_celery(Settings(data_dir=tmp_path, queue="turns"))
    taken: list[object] = []
    with app.connection_for_read() as connection:
        queue = Queue("turns", routing_key="turns")
        Producer(connection.default_channel).publish({"turn": 1}, routing_key="turns", declare=[queue])
        with Consumer(connection, queues=[queue], callbacks=[lambda body, message: taken.append(message.ack())]):
            connection.drain_events(timeout=10)  # the turn: the queue is busy from here
            busy = polls_in(connection, 0.8, counted)
            time.sleep(1.2)  # quiet for longer than IDLE_AFTER
            idle = polls_in(connection, 0.8, counted)
    assert len(taken) == 1
    assert busy >= 4 * idle, (busy, idle)  # 0.05 s between polls, then 0.5 s
