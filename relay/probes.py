"""/healthz and /readyz in front of a process's /metrics app: the bot's and a worker's endpoint serve both.

- ``/healthz``: 200 while the process serves HTTP at all.
- ``/livez``: 200 or 503 with a JSON report, from the process's own ``live``: 503 when it is stuck (bot/liveness.py
  for the bot: its event loop blocked, a duty's round unfinished, Discord silent), so that its orchestrator restarts
  it; where the process gives none, the same as ``/healthz``.
- ``/readyz``: 200 or 503 with a JSON report of why, from the process's own ``ready`` (bot/health.py for the
  bot, worker/metrics.py for a worker). Called on the HTTP server's thread: ``ready`` and ``live`` only read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Ready = Callable[[], tuple[bool, dict[str, Any]]]


def with_health(metrics: WSGIApp, ready: Ready, live: Ready | None = None) -> WSGIApp:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        probe = {"/readyz": ready, "/livez": live}.get(path)
        if path == "/healthz" or (path == "/livez" and probe is None):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"alive\n"]
        if probe is not None:
            ok, report = probe()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")])
            return [json.dumps(report).encode()]
        return metrics(environ, start_response)

    return app


def probe(url: str, timeout: float = 5.0) -> int:
    """0 when ``url`` answers 200, else 1, with what it said: a container's health check, with no curl in the image.

    ``python -m relay.probes http://127.0.0.1:9100/livez http://127.0.0.1:9100/readyz`` (compose.yaml): 0 when
    every URL answers 200.
    """
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            print(response.read().decode(errors="replace")[:2000])
            return 0
    except urllib.error.HTTPError as refused:
        print(f"{refused.code}: {refused.read().decode(errors='replace')[:2000]}")
    except OSError as exc:
        print(f"{url} does not answer: {exc}")
    return 1


if __name__ == "__main__":
    import sys

    sys.exit(max(probe(url) for url in sys.argv[1:]))
