"""Reading a Prometheus endpoint as Prometheus does: over HTTP, in the text format; and its probes (/readyz, /livez)
as an orchestrator does."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    """A port nothing listens on now (the OS picks it), for an endpoint a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int, timeout: float = 5.0) -> Samples:
    """Every sample the endpoint on ``port`` shows, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_when_up(port: int, timeout: float = 60.0) -> Samples:
    """Scrape, waiting for the endpoint to answer (a process starting, or started again)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """One sample's value; None when the endpoint does not show it."""
    return samples.get((name, frozenset(labels.items())))


def probe(port: int, path: str) -> tuple[int, dict]:
    """A probe's status and JSON report (``path``: "readyz" or "livez")."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def probe_until(port: int, path: str, status: int, timeout: float = 60.0) -> dict:
    """The probe's report once it answers ``status`` (the endpoint may not be up yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            got, report = probe(port, path)
            if got == status:
                return report
        time.sleep(0.2)
    raise AssertionError(f"/{path} never answered {status} within {timeout:.0f} s")
