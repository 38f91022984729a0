"""Real worker processes on real brokers, for the tests.

Worker processes are `animegamer worker` subprocesses configured only through the
environment, exactly as a user runs them; the test process talks to them through its own
Celery app built from the same settings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery
from celery.result import AsyncResult

from animegamer.cli.worker import TAKES_TURNS
from game.contract import TASK_NAME, TurnRequest
from relay.celery_app import make_celery
from relay.settings import Settings
from tests import tiers

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
WORKER_START_SECONDS = 120
# The shared workers' turns are plain ones, made for the game around them: four denoising steps, not the tiny model's
# 50, which were 0.35 s of CPU a turn over some 200 turns of the suite. (A test about a turn's own steps starts a
# worker of its own.)
SHARED_STEPS = {"ANIMEGAMER_NUM_STEPS": "4"}


def redis_url_or_skip() -> str:
    tiers.starting("a connection to Redis")
    url = os.environ.get("ANIMEGAMER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis answers at {url} ({exc}); `make test` starts one where it can")
    return url


@dataclass
class Worker:
    """A running `animegamer worker` and a Celery app pointed at the same queue."""

    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    app: Celery
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)

    def send_turn(self, instruction: str, prefix: str = "turn", seed: int = 1, **options: float) -> AsyncResult:
        """Send a turn with a fresh job id: Redis keeps results for a day, and an id seen before would answer at
        once. ``options`` go to ``send_task`` (a turn's own ``time_limit``, ...)."""
        request = TurnRequest(job_id=f"{prefix}-{uuid.uuid4().hex[:8]}", instruction=instruction, seed=seed)
        return self.app.send_task(TASK_NAME, args=[request.model_dump(mode="json")], task_id=request.job_id, **options)

    def said(self, text: str) -> int:
        """How many lines of the worker's log contain ``text``."""
        return sum(text in line for line in self.log.read_text(errors="replace").splitlines())


def worker_env(data_dir: Path, broker_url: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANIMEGAMER_")}
    env.update(
        ANIMEGAMER_DATA_DIR=str(data_dir),
        ANIMEGAMER_QUEUE=f"test-{uuid.uuid4().hex[:8]}",
        ANIMEGAMER_MODEL="tiny",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    if broker_url:
        env.update(ANIMEGAMER_BROKER_URL=broker_url, ANIMEGAMER_RESULT_BACKEND=broker_url)
    env.update(extra)
    return env


def machine(folder: Path) -> dict[str, str]:
    """What a process started in ``folder`` (its working directory) gets as another machine would: a data folder,
    a HOME and a TMPDIR of its own."""
    for name in ("data", "home", "tmp"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    return {"ANIMEGAMER_DATA_DIR": str(folder / "data"), "HOME": str(folder / "home"), "TMPDIR": str(folder / "tmp")}


def settings_for(env: dict[str, str]) -> Settings:
    """The settings a process started with ``env`` reads (lists arrive as JSON, as in the environment). A setting
    with environment names of its own (``ANIMEGAMER_CLAIM_SECONDS``, which ``ANIMEGAMER_LEASE_SECONDS`` was) is passed
    by that name: pydantic ignores its field name, so a worker's claim of 3 s reached the test's bot as the default
    30 s."""

    def value(text: str) -> object:
        return json.loads(text) if text.startswith("[") else text

    def name(key: str) -> str:
        short = key.removeprefix("ANIMEGAMER_").lower()
        field = Settings.model_fields.get(short)
        return key if field is not None and field.validation_alias is not None else short

    return Settings(**{name(k): value(v) for k, v in env.items() if k.startswith("ANIMEGAMER_")})


def start_worker(
    env: dict[str, str], module: str = "animegamer", cwd: Path = REPO, prefix: Sequence[str] = ()
) -> Worker:
    """Start a worker and wait until it has loaded the model and is consuming.

    ``module`` runs instead of ``animegamer`` (e.g. ``tests.faulty_worker``, whose pipeline hangs on request);
    ``cwd`` is its working directory (the installed package runs from anywhere); ``prefix`` runs it through
    another command (``ip netns exec NAME``, which execs it: the process is still the worker).
    """
    tiers.starting("a worker process")
    log = Path(env["ANIMEGAMER_DATA_DIR"]) / f"worker-{uuid.uuid4().hex[:6]}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                module,
                *(["worker"] if module == "animegamer" else []),
                "--loglevel",
                "INFO",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )
    deadline = time.monotonic() + WORKER_START_SECONDS
    # Celery's "ready." comes as the pool starts, before its process has loaded the model and announced itself to
    # the bot and `animegamer check` (a test that asked at once found no worker serving its queue).
    while b"ready." not in (said := log.read_bytes()) or TAKES_TURNS.encode() not in said:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"worker did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    return Worker(env, proc, make_celery(settings_for(env)), log)
