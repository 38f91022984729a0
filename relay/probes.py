"""/healthz and /readyz in front of a process's /metrics app: the bot's and a worker's endpoint serve both.

- ``/healthz``: 200 while the process serves HTTP at all (liveness: restart it when this fails).
- ``/readyz``: 200 or 503 with a JSON report of why, from the process's own ``ready`` (bot/health.py for the
  bot, worker/metrics.py for a worker). Called on the HTTP server's thread: ``ready`` only reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Ready = Callable[[], tuple[bool, dict[str, Any]]]


def with_health(metrics: WSGIApp, ready: Ready) -> WSGIApp:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"alive\n"]
        if path == "/readyz":
            ok, report = ready()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")])
            return [json.dumps(report).encode()]
        return metrics(environ, start_response)

    return app
