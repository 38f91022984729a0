"""A redis-server of a test's own, on a free port, that the test may stop and restart (the shared one stays up).

It daemonizes, so no test waits on it: every one still running when its test process ends is killed then
(``stop_all``, from tests/conftest.py), whatever the test did, so a run leaves no server behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests import tiers

if TYPE_CHECKING:
    from tests.certificates import Certificates


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """``persist=False`` is how this machine's Redis runs: a restart forgets every queued message."""

    running: ClassVar[set[RedisServer]] = set()  # started and not yet stopped, in this test process

    def __init__(
        self,
        folder: Path,
        *,
        persist: bool = False,
        host: str = "127.0.0.1",
        password: str | None = None,
        tls: Certificates | None = None,
        client_certificates: bool = False,
        users: tuple[str, ...] = (),
    ) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed; `make test` installs it where it can")
        self.folder, self.persist, self.host, self.port = folder, persist, host, free_port()
        self.password = password  # off the loopback, Redis takes no client without one (protected mode)
        self.tls = tls  # TLS only (no plain-text port)
        self.client_certificates = client_certificates  # whether a client must show a certificate signed by tls.ca
        self.users = users  # ACL users beside the default one, as `user` lines (relay/redis_acl.py)
        folder.mkdir(parents=True, exist_ok=True)

    def url(self, db: int = 0) -> str:
        """Without any TLS option: the settings under test add those (``rediss://`` where the server has TLS)."""
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}{self.host}:{self.port}/{db}"

    def _listen(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            *("--port", "0", "--tls-port", str(self.port)),
            *("--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)),
            *("--tls-ca-cert-file", str(self.tls.ca)),
            *("--tls-auth-clients", "yes" if self.client_certificates else "no"),
        ]

    def start(self) -> None:
        tiers.starting("a Redis server")
        persistence = ["--appendonly", "yes"] if self.persist else ["--appendonly", "no"]
        subprocess.run(
            [
                "redis-server",
                "--bind",
                self.host,
                *self._listen(),
                "--dir",
                str(self.folder),
                "--save",
                "",
                *persistence,
                *(["--requirepass", self.password] if self.password else []),
                *(arg for user in self.users for arg in ("--user", *user.split())),
                "--pidfile",
                str(self.pidfile),
                "--daemonize",
                "yes",
            ],
            check=True,
            capture_output=True,
        )
        RedisServer.running.add(self)
        client = self._client()
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                return
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    @property
    def pidfile(self) -> Path:
        return self.folder / "redis.pid"

    def stop(self) -> None:
        RedisServer.running.discard(self)
        with contextlib.suppress(redis.RedisError):  # the server closes the connection as it goes
            self._client().shutdown(nosave=True)
        for _ in range(200):
            try:
                self._client(socket_connect_timeout=0.1).ping()
            except redis.AuthenticationError:
                break  # a test changed its password: killed below
            except redis.ConnectionError:
                return
            time.sleep(0.05)
        with contextlib.suppress(OSError, ValueError):  # gone meanwhile, or its file never written
            os.kill(int(self.pidfile.read_text()), signal.SIGKILL)

    @classmethod
    def stop_all(cls) -> None:
        for server in list(cls.running):
            server.stop()

    def _client(self, **options: float) -> redis.Redis:
        # No retries: redis-py 8 retries a refused connection 10 times with backoff, so each stop() spent 7.5 s
        # asking a server that had already gone whether it had.
        tls: dict[str, object] = {}
        if self.tls is not None:
            # Whether it is up, not whether its certificate is good: a test may give it an expired one on purpose.
            tls = {"ssl": True, "ssl_cert_reqs": "none", "ssl_check_hostname": False}
            if self.client_certificates:
                tls.update(ssl_certfile=str(self.tls.client_cert), ssl_keyfile=str(self.tls.client_key))
        return redis.Redis(
            host=self.host, port=self.port, password=self.password, retry=Retry(NoBackoff(), 0), **tls, **options
        )

    def restart(self) -> None:
        self.stop()
        self.start()
