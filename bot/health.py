"""The bot's readiness, served as /readyz beside /metrics on ANIMEGAMER_METRICS_PORT (relay/probes.py; 127.0.0.1
unless ANIMEGAMER_METRICS_ADDRESS opens it), for a service manager, a load balancer or compose's health checks.

- Ready when the gateway is connected (no shard of this process disconnected for more than ``SHARD_DOWN_SECONDS``:
  a resume takes well under that), the queue answered its last call, and the duties that tick every second or so
  (the supervisor, which reads the database every tick, and the vote rounds) ticked within ``STALE_SECONDS``; 503
  otherwise, or while the bot stops. The JSON body says which (a shard down is named, with how long), and how
  long ago each duty ticked, retention's hourly sweep included (reported, not required).

Read from the HTTP server's thread: it only reads attributes the loop sets, never awaits the loop.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

STALE_SECONDS = 60.0  # a duty whose last good tick is older than this is stuck (a tick takes well under a second)
SHARD_DOWN_SECONDS = 5.0  # a shard disconnected longer than this is an outage, not a reconnect


def readiness(bot: AnimeGamerBot) -> tuple[bool, dict[str, Any]]:
    now = time.monotonic()
    duties = {"supervisor": bot.supervisor, "rounds": bot.rounds, "retention": bot.retention}
    ages = {name: None if d.ticked_at is None else round(now - d.ticked_at, 1) for name, d in duties.items()}
    stale = [name for name in ("supervisor", "rounds") if ages[name] is None or ages[name] > STALE_SECONDS]
    lost = dict(bot.disconnected)  # written by the loop, read from this thread: a copy
    down = {shard: round(now - since, 1) for shard, since in lost.items() if now - since > SHARD_DOWN_SECONDS}
    gateway = bot.is_ready() and not bot.is_closed() and not down
    said = "; ".join(f"shard {shard} disconnected for {seconds} s" for shard, seconds in sorted(down.items()))
    queue = bot.presence.queue_answers
    ready = gateway and queue is not False and not stale and not bot.stopping
    report = {
        "ready": ready,
        "gateway": "connected" if gateway else said or "not connected",
        "queue": {True: "answering", False: "not answering", None: "not asked yet"}[queue],
        "database": "not reached lately" if "supervisor" in stale else "reachable",
        "seconds_since_tick": ages,
        "stale": stale,
        "stopping": bot.stopping,
    }
    return ready, report
