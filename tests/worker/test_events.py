"""Celery's events, what Flower reads: a turn on Redis seen from sent to succeeded, by its job and not its words."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from bot.queue import TurnQueue
from game.contract import TurnRequest
from tests.workers import Worker

pytestmark = pytest.mark.slow

WORDS = "Character: Qiqi; Motion: gently wave; Background: secret garden."


def test_a_turn_sent_by_the_bot_shows_in_the_event_stream_by_its_job_not_its_words(redis_worker: Worker):
    app = redis_worker.app
    task_id = str(uuid.uuid4())
    events: list[dict] = []
    listening = threading.Event()

    def note(event: dict) -> None:
        events.append(event)
        listening.set()  # the worker's heartbeat arrives every 2 s: the receiver is subscribed

    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": note})
        thread = threading.Thread(target=lambda: receiver.capture(limit=None, timeout=90), daemon=True)
        thread.start()
        try:
            assert listening.wait(15), "no event reached the receiver"
            request = TurnRequest(job_id="4242", instruction=WORDS, seed=5)
            queue = TurnQueue(app, timeout=3.0)
            asyncio.run(queue.send(request, task_id, redis_worker.env["ANIMEGAMER_QUEUE"]))
            queue.close()
            deadline = time.monotonic() + 90
            while not any(e["type"] == "task-succeeded" and e.get("uuid") == task_id for e in list(events)):
                assert time.monotonic() < deadline, f"no task-succeeded event: {[e['type'] for e in events]}"
                time.sleep(0.1)
        finally:
            receiver.should_stop = True
            thread.join(10)
    mine = [e for e in events if e.get("uuid") == task_id]
    # Each once. Not in a set order: task-sent is published by the sender's connection after the message, and
    # the worker may receive the message and publish task-received on its own connection before it.
    assert sorted(e["type"] for e in mine if e["type"] in ("task-sent", "task-received", "task-started")) == [
        "task-received",
        "task-sent",
        "task-started",
    ]
    assert [e["args"] for e in mine if "args" in e] == ["[job 4242]", "[job 4242]"]
    assert not [e for e in mine if "secret garden" in repr(e)]
