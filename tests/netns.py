"""A network namespace of a test's own, joined to this one by a veth pair: a process started in it (``prefix``)
reaches this machine only at ``host_address``, as a worker on another machine reaches the bot's Redis.

Needs root (CAP_NET_ADMIN) and iproute2; ``network_namespace()`` skips the test, saying why, where either is
missing.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Namespace:
    name: str
    host_address: str  # this side of the veth pair
    address: str  # the namespace's side

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def network_namespace() -> Iterator[Namespace]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed: no network namespace to put the worker in")
    tag = f"{os.getpid() % 10000}{random.randrange(1000):03d}"
    subnet = random.randrange(1, 250)
    space = Namespace(f"ag{tag}", f"10.231.{subnet}.1", f"10.231.{subnet}.2")
    outside, inside = f"agh{tag}", f"agn{tag}"  # interface names: 15 characters at most
    try:
        _ip("netns", "add", space.name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot make a network namespace here ({exc.stderr.strip()}): it needs root (CAP_NET_ADMIN)")
    try:
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", space.name)
        _ip("addr", "add", f"{space.host_address}/24", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("-n", space.name, "addr", "add", f"{space.address}/24", "dev", inside)
        _ip("-n", space.name, "link", "set", inside, "up")
        _ip("-n", space.name, "link", "set", "lo", "up")
        yield space
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", space.name)  # takes its end of the pair, and so the pair, with it
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", outside)
