"""What a turn costs the queue: requests and results stay small, large bytes go through the blob store.

The budgets: a window-1 request under 8 KB and a window-5 one under 2 MB as Celery puts them on Redis,
and a whole turn writing less than three times its clip into Redis (the request, every state the
worker stores, the result, the claim). Redis' own count of the bytes it received is read on a
redis-server of this module's own, so nobody else's traffic is counted.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch
from celery import Celery
from safetensors.torch import save as save_safetensors

from game.contract import TASK_NAME, BlobRef, HistoryTurn, TurnRequest, TurnResult
from game.state import StateDeltas
from relay.blob_store import BlobError, FolderBlobStore, store_for
from relay.celery_app import make_celery
from relay.control import Holder, RedisControl
from relay.settings import Settings
from tests import tiers
from tests.redis_server import RedisServer
from tests.workers import Worker, settings_for, start_worker, worker_env

LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
DELTAS = StateDeltas(motion=1, social=0, entertainment=1, stamina=-1)
PUBLISHED = (226, 1920)  # the published model's representation (ANIMEGAMER.md)
POLL_SECONDS = 0.1


@pytest.fixture(scope="module")
@tiers.slow_fixture
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("payload-redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def counted_worker(private_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """A worker (tiny model) of its own: the only client of its Redis besides this module."""
    worker = start_worker(worker_env(tmp_path_factory.mktemp("payload-worker"), private_redis.url()))
    yield worker
    worker.kill(signal.SIGTERM)


def published_representation(seed: int) -> bytes:
    tensor = torch.randn(*PUBLISHED, generator=torch.Generator().manual_seed(seed)).to(torch.float16)
    return save_safetensors({"representation": tensor})


def bytes_on_redis(server: RedisServer, settings: Settings, request: TurnRequest) -> int:
    """The request's message exactly as Celery leaves it in the queue (nobody consumes this queue)."""
    queue = f"unread-{uuid.uuid4().hex[:8]}"
    app = make_celery(settings)
    packed = store_for(settings).pack_request(request)  # as the bot's supervisor sends it
    app.send_task(TASK_NAME, args=[packed.model_dump(mode="json")], task_id=request.job_id, queue=queue)
    client = redis.Redis(port=server.port)
    message = client.lindex(queue, 0)
    client.delete(queue)
    assert message is not None
    return len(message)


def test_a_window_1_request_is_under_8_kb_on_redis(private_redis, tmp_path):
    settings = settings_for(worker_env(tmp_path, private_redis.url()))
    request = TurnRequest(job_id=uuid.uuid4().hex, instruction=LINE, seed=1)
    assert bytes_on_redis(private_redis, settings, request) < 8 * 1024


def test_a_window_5_request_with_published_size_representations_is_under_2_mb_on_redis(private_redis, tmp_path):
    settings = settings_for(worker_env(tmp_path, private_redis.url()))
    history = [
        HistoryTurn(instruction=LINE, representation=published_representation(i), deltas=DELTAS) for i in range(4)
    ]
    request = TurnRequest(job_id=uuid.uuid4().hex, instruction=LINE, seed=1, history=history)
    assert len(history[0].representation) > 800_000  # 226 x 1920 float16: the budget is not met by smallness
    assert bytes_on_redis(private_redis, settings, request) < 2 * 1024 * 1024


def received(server: RedisServer) -> int:
    return int(redis.Redis(port=server.port).info("stats")["total_net_input_bytes"])


def play_counted(worker: Worker, server: RedisServer, history: list[HistoryTurn]) -> tuple[TurnResult, int]:
    """One turn as the bot plays it (send, poll the stored state, read the result, forget it), and Redis' bytes in."""
    settings = settings_for(worker.env)
    blobs, app = store_for(settings), worker.app
    control = RedisControl(server.url(), timeout=3.0)
    job_id = f"counted-{uuid.uuid4().hex[:8]}"
    request = blobs.pack_request(TurnRequest(job_id=job_id, instruction=LINE, seed=1, history=history))
    before = received(server)
    app.send_task(TASK_NAME, args=[request.model_dump(mode="json")], task_id=job_id)
    deadline = time.monotonic() + 120
    while (meta := app.backend.get_task_meta(job_id, cache=False))["status"] != "SUCCESS":
        assert meta["status"] != "FAILURE", meta["result"]
        assert time.monotonic() < deadline, "the turn did not finish"
        time.sleep(POLL_SECONDS)
    while control.holders([job_id])[job_id] is not Holder.ENDED:  # the worker's last write: its claim ends
        time.sleep(POLL_SECONDS)
    app.AsyncResult(job_id).forget()
    used = received(server) - before
    return blobs.resolve_result(TurnResult.model_validate(meta["result"])), used


@pytest.mark.slow
def test_a_turn_writes_less_than_three_times_its_clip_into_redis(counted_worker, private_redis):
    result, used = play_counted(counted_worker, private_redis, [])
    assert used < 3 * len(result.mp4), f"{used} B into Redis for a {len(result.mp4)} B clip"


@pytest.mark.slow
def test_a_window_5_turn_writes_less_than_three_times_its_clip_into_redis(counted_worker, private_redis):
    first, _ = play_counted(counted_worker, private_redis, [])
    past = HistoryTurn(instruction=LINE, representation=first.representation, deltas=first.deltas)
    result, used = play_counted(counted_worker, private_redis, [past] * 4)
    assert used < 3 * len(result.mp4), f"{used} B into Redis for a {len(result.mp4)} B clip"


def send_with_past(worker: Worker, representation: BlobRef):
    past = HistoryTurn(instruction=LINE, representation=representation, deltas=DELTAS)
    job_id = f"blob-{uuid.uuid4().hex[:8]}"
    request = TurnRequest(job_id=job_id, instruction=LINE, seed=1, history=[past])
    return worker.app.send_task(TASK_NAME, args=[request.model_dump(mode="json")], task_id=job_id)


def workers_blobs(worker: Worker) -> FolderBlobStore:
    store = store_for(settings_for(worker.env))
    assert isinstance(store, FolderBlobStore)  # the SQLite worker's: its results are not in Redis
    return store


@pytest.mark.slow
def test_a_turn_whose_past_representation_is_missing_fails_naming_the_file(sqlite_worker):
    ref = BlobRef(sha256=uuid.uuid4().hex * 2, size=14_552)
    with pytest.raises(BlobError, match="missing") as caught:
        send_with_past(sqlite_worker, ref).get(timeout=60)
    assert str(workers_blobs(sqlite_worker).path_for(ref.sha256)) in str(caught.value)


@pytest.mark.slow
def test_a_turn_whose_past_representation_is_damaged_fails_naming_the_file(sqlite_worker):
    blobs = workers_blobs(sqlite_worker)
    data = os.urandom(20_000)
    ref = blobs.put(data)
    path: Path = blobs.path_for(ref.sha256)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # one byte off, whatever it was
    with pytest.raises(BlobError, match="damaged") as caught:
        send_with_past(sqlite_worker, ref).get(timeout=60)
    assert str(path) in str(caught.value)


def test_a_celery_app_built_from_settings_stores_no_task_arguments_with_results(tmp_path):
    """Extended results would copy a turn's history into every progress report."""
    app: Celery = make_celery(settings_for(worker_env(tmp_path)))
    assert not app.conf.result_extended
