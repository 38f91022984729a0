"""A worker's Prometheus endpoint, scraped over HTTP from real worker processes."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
from celery.exceptions import TimeLimitExceeded

from tests.redis_server import RedisServer
from tests.scrape import free_port, probe_until, scrape_when_up, value
from tests.workers import Worker, start_worker, worker_env

pytestmark = pytest.mark.slow

LINE = "Character: Qiqi; Motion: gently wave; Background: day town."
STAGES = ("prompt", "state_pass", "representation_pass", "denoise", "vae", "encode")


def port_of(worker: Worker) -> int:
    return int(worker.env["ANIMEGAMER_WORKER_METRICS_PORT"])


def play(worker: Worker, instruction: str = LINE, timeout: float = 120, **limits: float):
    return worker.send_turn(instruction, "metrics", seed=3, **limits).get(timeout=timeout)


def stage_counts(port: int) -> dict[str, float]:
    samples = scrape_when_up(port)
    return {stage: value(samples, "animegamer_turn_stage_seconds_count", stage=stage) or 0.0 for stage in STAGES}


def test_the_workers_endpoint_times_every_stage_of_a_finished_turn(sqlite_worker):
    before = stage_counts(port_of(sqlite_worker))
    play(sqlite_worker)
    after = stage_counts(port_of(sqlite_worker))
    assert all(after[stage] >= before[stage] + 1 for stage in STAGES), (before, after)


def test_a_cpu_worker_shows_no_gpu_memory(sqlite_worker):
    play(sqlite_worker)
    samples = scrape_when_up(port_of(sqlite_worker))
    assert not [name for name, _ in samples if name.startswith("animegamer_gpu_memory")]


def test_the_endpoint_is_served_again_by_the_child_that_replaces_one_killed_at_the_hard_time_limit(tmp_path):
    port = free_port()
    env = worker_env(
        tmp_path,
        ANIMEGAMER_TASK_TIME_LIMIT="10",
        ANIMEGAMER_WORKER_METRICS_PORT=str(port),
        ANIMEGAMER_METRICS_ADDRESS="127.0.0.1",
    )
    worker = start_worker(env, module="tests.faulty_worker")  # its pipeline hangs on "hang", deaf to the soft limit
    try:
        scrape_when_up(port)
        with pytest.raises(TimeLimitExceeded):
            play(worker, "Character: Qiqi; Motion: hang; Background: town.", timeout=90)
        play(worker, time_limit=120, soft_time_limit=90)  # made by the pool's fresh child, given a busy CI's time
        samples = scrape_when_up(port)
    finally:
        worker.kill()
    assert value(samples, "animegamer_turn_stage_seconds_count", stage="denoise") == 1  # counted by the new child


def test_a_worker_with_its_model_loaded_is_ready_and_says_what_it_serves(sqlite_worker):
    port = port_of(sqlite_worker)
    scrape_when_up(port)
    report = probe_until(
        port, "readyz", 200
    )  # a worker started for this test serves the endpoint before its model loads
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        alive = response.status
    assert alive == 200 and report["broker"] == "answering"
    assert report["loaded"] and report["model"] == "tiny"
    assert report["queues"] == [sqlite_worker.env["ANIMEGAMER_QUEUE"]] and report["characters"]


def test_a_worker_whose_broker_stops_answering_is_not_ready_until_it_answers_again(tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    port = free_port()
    worker = start_worker(worker_env(tmp_path / "worker", server.url(), ANIMEGAMER_WORKER_METRICS_PORT=str(port)))
    try:
        probe_until(port, "readyz", 200)
        server.stop()
        down = probe_until(port, "readyz", 503)
        server.start()
        back = probe_until(port, "readyz", 200)
    finally:
        worker.kill()
        server.stop()
    assert down["loaded"] and "does not answer" in down["broker"] and f":{server.port}/" in down["broker"]
    assert back["broker"] == "answering"


def test_a_worker_whose_detector_does_not_load_is_not_ready_and_says_why(tmp_path):
    """Its clips would all be withheld: it must not count as ready (a rollout, KEDA). Caused as a broken install is:
    a nudenet that does not import."""
    broken = tmp_path / "site" / "nudenet"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("nudenet broke", name="nudenet")\n')
    port = free_port()
    env = worker_env(tmp_path / "worker", ANIMEGAMER_WORKER_METRICS_PORT=str(port), PYTHONPATH=str(tmp_path / "site"))
    worker = start_worker(env)
    try:
        deadline = time.monotonic() + 60
        while not (report := probe_until(port, "readyz", 503))["loaded"]:
            assert time.monotonic() < deadline, report
            time.sleep(0.2)
    finally:
        worker.kill()
    assert not report["ready"] and report["broker"] == "answering"
    assert report["detector"].startswith("none:") and "nudenet is missing" in report["detector"]
