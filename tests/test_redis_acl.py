"""Least privilege in Redis, against a real Redis 7 given the users of relay/redis_acl.py: a worker on the workers'
user plays turns sent on the bot's user, through a Redis restart and a SIGKILL mid-turn, and is refused (NOPERM)
every administrative command, every listing of keys and every key of another game."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from game.contract import TASK_NAME, TurnRequest
from relay.celery_app import make_celery
from relay.redis_acl import bot_user, worker_user
from relay.settings import Settings
from tests import tiers
from tests.redis_server import RedisServer
from tests.workers import start_worker, worker_env

pytestmark = tiers.SLOW

QUEUE = f"acl-{uuid.uuid4().hex[:8]}"
WORKER_PASSWORD, BOT_PASSWORD = "w0rker/+=%41", "b0t#?@:"  # reserved characters and a %41, as typed
WAVE = "Character: Qiqi; Motion: gently wave; Background: day town."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    users = (worker_user("worker", WORKER_PASSWORD, QUEUE), bot_user("bot", BOT_PASSWORD, QUEUE))
    started = RedisServer(tmp_path_factory.mktemp("acl-redis"), password="admin-only", users=users)
    started.start()
    yield started
    started.stop()


def url(server: RedisServer, user: str, password: str, db: int) -> str:
    return f"redis://{user}:{quote(password, safe='')}@127.0.0.1:{server.port}/{db}"


def bot_app(server: RedisServer, tmp_path: Path):
    settings = Settings(
        data_dir=tmp_path, broker_url=url(server, "bot", BOT_PASSWORD, 0),
        result_backend=url(server, "bot", BOT_PASSWORD, 1), queue=QUEUE,
    )  # fmt: skip
    return make_celery(settings)


def send(app, seed: int = 1):
    request = TurnRequest(job_id=f"acl-{uuid.uuid4().hex[:8]}", instruction=WAVE, seed=seed)
    return app.send_task(TASK_NAME, args=[request.model_dump(mode="json")], task_id=request.job_id, queue=QUEUE)


def test_a_worker_on_the_workers_user_plays_through_a_restart_and_a_kill_mid_turn(
    server: RedisServer, tmp_path: Path
) -> None:
    env = worker_env(
        tmp_path / "worker", url(server, "worker", WORKER_PASSWORD, 0), ANIMEGAMER_QUEUE=QUEUE,
        ANIMEGAMER_VISIBILITY_TIMEOUT="3", ANIMEGAMER_CLAIM_SECONDS="2",
    )  # fmt: skip
    env["ANIMEGAMER_RESULT_BACKEND"] = url(server, "worker", WORKER_PASSWORD, 1)
    app = bot_app(server, tmp_path)
    first = start_worker(env)
    second = None
    try:
        assert send(app).get(timeout=120)["num_frames"] == 17
        server.restart()  # the users come back with it (they are in its configuration)
        assert send(app, seed=2).get(timeout=120)["num_frames"] == 17
        first.kill()
        slow = start_worker({**env, "ANIMEGAMER_NUM_STEPS": "1000"})
        running = send(app, seed=3)
        deadline = time.monotonic() + 120
        while running.state != "PROGRESS":
            assert slow.proc.poll() is None and time.monotonic() < deadline, "the slow turn never started"
            time.sleep(0.1)
        slow.kill(signal.SIGKILL)  # mid-turn: the message stays unacknowledged, to be put back after 3 s
        second = start_worker({**env, "ANIMEGAMER_NUM_STEPS": "4"})
        assert running.get(timeout=180)["num_frames"] == 17
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.kill()
    for worker in (first, second):
        assert worker is not None and worker.said("NOPERM") == 0, worker.log.read_text(errors="replace")[-3000:]


@pytest.mark.parametrize(
    "command",
    [
        ("FLUSHDB",),
        ("FLUSHALL",),
        ("CONFIG", "GET", "*"),
        ("KEYS", "*"),
        ("SCAN", "0"),
        ("ACL", "LIST"),
        ("CLIENT", "KILL", "TYPE", "normal"),
        ("SCRIPT", "FLUSH"),
        ("SHUTDOWN", "NOSAVE"),
        ("LPUSH", "another-game", "a turn"),
        ("GET", "another-game.unacked"),
    ],
)
def test_the_workers_user_is_refused_what_it_does_not_need(server: RedisServer, command: tuple[str, ...]) -> None:
    client = redis.Redis.from_url(url(server, "worker", WORKER_PASSWORD, 0))
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command(*command)


def test_the_bots_user_is_refused_administration(server: RedisServer) -> None:
    client = redis.Redis.from_url(url(server, "bot", BOT_PASSWORD, 0))
    for command in (("FLUSHALL",), ("CONFIG", "SET", "requirepass", "x"), ("ACL", "SETUSER", "worker", "+@all")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)


def test_the_operators_guide_holds_the_users_as_the_code_writes_them() -> None:
    guide = (Path(__file__).resolve().parents[1] / "docs" / "operating.md").read_text()
    assert f"user {worker_user('animegamer-worker', 'WORKER_PASSWORD', 'turns')}\n" in guide
    assert f"user {bot_user('animegamer-bot', 'BOT_PASSWORD', 'turns')}\n" in guide
