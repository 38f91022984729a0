"""Reading a Prometheus endpoint as Prometheus does: over HTTP, in the text format."""

from __future__ import annotations

import socket
import time
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
