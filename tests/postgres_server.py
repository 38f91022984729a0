"""A PostgreSQL server of a test's own (initdb, then pg_ctl), for what the shared one cannot be asked to do: speak TLS
on certificates the test made. Run as the ``postgres`` user where the tests run as root, which PostgreSQL refuses.
Stopped with its test (``stop``), and its folder removed."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pytest

from tests import tiers
from tests.redis_server import free_port

if TYPE_CHECKING:
    from tests.certificates import Certificates


def _binary(name: str) -> str | None:
    return shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)


class PostgresServer:
    running: ClassVar[set[PostgresServer]] = set()  # started and not yet stopped, in this test process

    @classmethod
    def stop_all(cls) -> None:
        for server in list(cls.running):
            server.stop()

    def __init__(self, tls: Certificates) -> None:
        self.initdb, self.pg_ctl = _binary("initdb"), _binary("pg_ctl")
        if self.initdb is None or self.pg_ctl is None:
            pytest.skip("PostgreSQL's initdb and pg_ctl are not installed (Debian: postgresql)")
        self.as_postgres: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode:
                pytest.skip("running as root, with no postgres user to run a PostgreSQL server as")
            self.as_postgres = ["runuser", "-u", "postgres", "--"]
        self.tls, self.port = tls, free_port()
        self.folder: Path | None = None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str) -> None:
        done = subprocess.run([*self.as_postgres, *command], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise AssertionError(f"{command[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def start(self) -> None:
        tiers.starting("a PostgreSQL server")
        self.folder = Path(tempfile.mkdtemp(prefix="agtest-pg-"))  # not under the test's folder: root's alone
        data = self.folder / "data"
        for name, source in (("server.pem", self.tls.cert), ("server.key", self.tls.key)):
            shutil.copyfile(source, self.folder / name)
        (self.folder / "server.key").chmod(0o600)
        if self.as_postgres:
            shutil.chown(self.folder, "postgres")
            for path in self.folder.iterdir():
                shutil.chown(path, "postgres")
        assert self.initdb is not None and self.pg_ctl is not None
        self._run(self.initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.folder} -c ssl=on "
            f"-c ssl_cert_file={self.folder / 'server.pem'} -c ssl_key_file={self.folder / 'server.key'} -c fsync=off"
        )
        PostgresServer.running.add(self)
        self._run(self.pg_ctl, "-D", str(data), "-o", options, "-l", str(self.folder / "log"), "-w", "start")

    def stop(self) -> None:
        PostgresServer.running.discard(self)
        if self.folder is None:
            return
        assert self.pg_ctl is not None
        subprocess.run(
            [*self.as_postgres, self.pg_ctl, "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None
