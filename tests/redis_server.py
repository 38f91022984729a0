"""A redis-server of a test's own, on a free port, that the test may stop and restart (the shared one stays up)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests import tiers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """``persist=False`` is how this machine's Redis runs: a restart forgets every queued message."""

    def __init__(self, folder: Path, *, persist: bool = False) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed; `make test` installs it where it can")
        self.folder, self.persist, self.port = folder, persist, free_port()
        folder.mkdir(parents=True, exist_ok=True)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        tiers.starting("a Redis server")
        persistence = ["--appendonly", "yes"] if self.persist else ["--appendonly", "no"]
        subprocess.run(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.folder),
                "--save",
                "",
                *persistence,
                "--daemonize",
                "yes",
            ],
            check=True,
            capture_output=True,
        )
        client = redis.Redis(port=self.port)
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                return
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        with contextlib.suppress(redis.ConnectionError):  # the server closes the connection as it goes
            redis.Redis(port=self.port).shutdown(nosave=True)
        for _ in range(200):
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.1).ping()
            except redis.ConnectionError:
                return
            time.sleep(0.05)

    def restart(self) -> None:
        self.stop()
        self.start()
