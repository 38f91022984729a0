"""The queue for real: worker processes on the SQLite broker and on Redis."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from kombu import Queue

from game.contract import PROGRESS_STATE, TASK_NAME, Stage, TurnRequest, TurnResult
from media.mp4 import decode_mp4
from relay.blob_store import store_for
from relay.celery_app import BrokerUnavailable, check_broker, make_celery
from relay.settings import Settings
from tests.redis_server import RedisServer
from tests.workers import Worker, redis_url_or_skip, settings_for, start_worker, worker_env

LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."


def send_turn(worker: Worker, prefix: str, seed: int = 1):
    return worker.send_turn(LINE, prefix, seed)


def test_importing_the_celery_app_and_its_task_does_not_import_torch():
    code = "import sys, relay.celery_app, worker.tasks; print('torch' in sys.modules)"
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "False"


@pytest.mark.slow
@pytest.mark.parametrize("worker", ["sqlite_worker", "redis_worker"])
def test_a_worker_completes_a_turn_sent_by_name(worker, request):
    running: Worker = request.getfixturevalue(worker)
    async_result = send_turn(running, worker)
    result = TurnResult.model_validate(async_result.get(timeout=120))
    assert result.job_id == async_result.id
    clip = store_for(settings_for(running.env)).resolve_result(result).mp4  # larger than a message: by reference
    assert decode_mp4(clip).shape == (17, 64, 96, 3)


@pytest.mark.slow
def test_a_request_that_breaks_the_contract_fails_with_a_clear_error(sqlite_worker):
    async_result = sqlite_worker.app.send_task(TASK_NAME, args=[{"instruction": "fly"}], task_id=uuid.uuid4().hex)
    with pytest.raises(Exception, match="Invalid turn request"):
        async_result.get(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["sqlite", "redis"])
def test_a_turn_whose_worker_is_killed_mid_task_is_redelivered_not_lost(broker, tmp_path):
    url = redis_url_or_skip() if broker == "redis" else None
    # A long turn (1,000 denoising steps) so the kill lands mid-task, and a short visibility timeout.
    # The dead worker's claim lapses after its lease (2 s), before the broker hands the message on.
    env = worker_env(
        tmp_path, url, ANIMEGAMER_NUM_STEPS="1000", ANIMEGAMER_VISIBILITY_TIMEOUT="3", ANIMEGAMER_CLAIM_SECONDS="2"
    )
    doomed = start_worker(env)
    async_result = send_turn(doomed, f"kill-{broker}")
    deadline = time.monotonic() + 60
    while not (async_result.state == PROGRESS_STATE and (async_result.info or {}).get("stage") == Stage.DENOISE):
        assert async_result.state != "FAILURE", async_result.result
        assert time.monotonic() < deadline, "the turn never started denoising"
        time.sleep(0.05)
    doomed.kill(signal.SIGKILL)

    rescuer = start_worker({**env, "ANIMEGAMER_NUM_STEPS": "4"})
    try:
        result = TurnResult.model_validate(async_result.get(timeout=120))
    finally:
        rescuer.kill(signal.SIGTERM)
    assert result.job_id == async_result.id


@pytest.mark.slow
@pytest.mark.parametrize("worker", ["sqlite_worker", "redis_worker"])
def test_a_turn_sent_twice_is_made_once(worker, request):
    """The outbox may send a job again (a resend after a restart); the worker's claim drops the second copy."""
    running: Worker = request.getfixturevalue(worker)
    job_id = f"twice-{uuid.uuid4().hex[:8]}"
    payload = [TurnRequest(job_id=job_id, instruction=LINE, seed=1).model_dump(mode="json")]
    first = running.app.send_task(TASK_NAME, args=payload, task_id=job_id)
    running.app.send_task(TASK_NAME, args=payload, task_id=job_id)
    TurnResult.model_validate(first.get(timeout=120))
    deadline = time.monotonic() + 30
    while running.said(f"turn {job_id} (job {job_id}) not run: taken") == 0:
        assert time.monotonic() < deadline, "the second copy was never dropped"
        time.sleep(0.1)
    assert running.said(f"job {job_id} done in") == 1


def test_a_game_with_a_short_visibility_timeout_never_puts_back_another_games_running_turn(redis_url, tmp_path):
    """Kombu's Redis transport keeps each delivered, unacknowledged message in an index, and every consumer puts back
    those delivered longer ago than its own visibility timeout. With one index for the whole Redis database, a game
    (or a test) with a short timeout handed another game's running turn to a second worker (seen in the fleet tests:
    Bob's turn, same task id, started again 24 s after it was taken); each game's queue now has its own index."""
    running = make_celery(settings_for(worker_env(tmp_path / "a", redis_url)))
    hasty = make_celery(settings_for(worker_env(tmp_path / "b", redis_url, ANIMEGAMER_VISIBILITY_TIMEOUT="1")))
    queue = running.conf.task_default_queue
    running.send_task(TASK_NAME, args=[{}], task_id=uuid.uuid4().hex)
    with running.connection_for_read() as taking, hasty.connection_for_read() as sweeping:
        channel = taking.default_channel
        deadline = time.monotonic() + 10
        while (message := channel.basic_get(queue, no_ack=False)) is None:  # a worker's delivery: the turn runs
            assert time.monotonic() < deadline, "the turn never reached its queue"
            time.sleep(0.05)
        try:
            time.sleep(1.5)  # older than the hasty game's visibility timeout
            idle = sweeping.Consumer(Queue(hasty.conf.task_default_queue), callbacks=[lambda body, msg: None])
            with idle, contextlib.suppress(socket.timeout):
                sweeping.drain_events(timeout=0.5)  # an idle worker's poll, which puts back what it deems lost
            assert channel.client.llen(queue) == 0
        finally:
            channel.basic_ack(message.delivery_tag)
            channel.queue_delete(queue)


TYPED = "ab%41cd/+=#?@:% é["  # every character a URL reserves, a space, a non-ASCII one, and a %-escape look-alike


@pytest.mark.slow  # a Redis server of its own
def test_a_redis_password_setting_reaches_redis_as_typed_percent_escape_and_all(tmp_path):
    """Compose puts REDIS_PASSWORD into ANIMEGAMER_REDIS_PASSWORD, not into a URL: a URL reads "%41" as "A"."""
    server = RedisServer(tmp_path / "redis", password=TYPED)
    server.start()
    try:
        at = f"redis://{server.host}:{server.port}"
        settings = Settings(data_dir=tmp_path, broker_url=f"{at}/0", result_backend=f"{at}/1", redis_password=TYPED)
        check_broker(make_celery(settings), timeout=5.0)  # the queue and the result store both let it in
        in_the_url = f"redis://:{TYPED}@{server.host}:{server.port}/0"  # the old way: the escape is decoded
        with pytest.raises(BrokerUnavailable, match="refuses this user name or password"):
            check_broker(make_celery(Settings(data_dir=tmp_path, broker_url=in_the_url)), timeout=1.0)
    finally:
        server.stop()


def test_a_broker_that_does_not_answer_is_reported_not_waited_for(tmp_path):
    settings = settings_for(worker_env(tmp_path, "redis://127.0.0.1:9/0"))
    with pytest.raises(BrokerUnavailable, match="does not answer"):
        check_broker(make_celery(settings), timeout=1.0)


@pytest.mark.slow
def test_a_worker_whose_model_cannot_load_stops_and_says_why(tmp_path):
    env = worker_env(
        tmp_path,
        ANIMEGAMER_MODEL="animegamer",
        ANIMEGAMER_CHECKPOINTS=str(tmp_path / "nowhere"),
        ANIMEGAMER_DEVICE="cpu",
        ANIMEGAMER_CHARACTERS='["Qiqi"]',
    )
    done = subprocess.run(
        [sys.executable, "-m", "animegamer", "worker", "--loglevel", "INFO"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = done.stdout + done.stderr
    assert "the model did not load, so this worker stops" in said
    assert "nowhere" in said  # the missing folder is named
