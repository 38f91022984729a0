"""What an operator watches on the bot: a Prometheus endpoint, off unless ANIMEGAMER_METRICS_PORT is set.

Each bot owns its registry (``BotMetrics``), so the hooks never branch on whether metrics are on:
they always count, and the endpoint only decides whether anyone can read the counts.

- How long an interaction waited for its first answer (a defer, a reply, a modal, autocomplete
  choices): from the moment the gateway handed it to the bot (``received``, called from
  ``AnimeGamerBot.dispatch`` before any handler can run) to the moment Discord accepted the answer
  (the interaction callback's HTTP response, seen through discord.py's public ``http_trace``). The
  bot's receipt time, not the snowflake's: it needs no clock shared with Discord, and it is what the
  bot controls; Discord's 3 s also include the gateway's delivery.
- Jobs queued and running per queue, set from the rows the supervisor reads each tick anyway, so a
  scrape costs no query.
- Turns by outcome, counted by whoever made the move, after its transaction committed and only if
  its guarded UPDATE matched, so each turn ends in exactly one count.
- Clip posts retried, and posts given up as undeliverable.
- Clips the safety policy decided on: flagged and posted in an age-restricted channel, flagged and withheld,
  unchecked (no detector on the worker, or it failed) and withheld. A rise in the last is a worker to fix.
- What the alerts page on (deploy/monitoring/alerts.yml), read at scrape time from what the loop already knows:
  how long the oldest turn not yet started has waited, live workers per queue the bot sends to, how long each of
  this process's shards has been disconnected, the Redis broker's memory against its limit, and the clip store's
  failed operations.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

import aiohttp
import discord
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from db.base import utcnow
from game.jobs import IN_FLIGHT, JobStatus
from relay.celery_app import queue_of_stored, served_queues
from relay.probes import Ready, with_health

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot
    from db.jobs import JobInfo
    from relay.settings import Settings

log = logging.getLogger(__name__)

OUTCOMES = ("done", "failed", "cancelled", "expired")
# Discord's deadline is 3 s; the buckets around it say how close the bot came.
ANSWER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
CALLBACK = re.compile(r"/interactions/(?P<id>\d+)/[^/]+/callback$")  # the token in the path is never kept
WAITING_LIMIT = 10_000  # interactions received and not yet answered that are remembered (a bound, not a queue)
SUBCOMMAND, SUBCOMMAND_GROUP = 1, 2  # Discord's option types that name a part of the command


SAFETY_DECISIONS = ("posted_flagged", "withheld_flagged", "withheld_unchecked")
STORE_OPERATIONS = ("put", "get", "delete", "list")  # present at 0; others appear once one fails


class BotMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.first_answer = Histogram(
            "animegamer_interaction_first_answer_seconds",
            "Seconds from receiving an interaction to Discord accepting its first answer (defer or reply).",
            ["command"],
            buckets=ANSWER_BUCKETS,
            registry=self.registry,
        )
        self.queue_jobs = Gauge(
            "animegamer_queue_jobs",
            "Jobs in flight by queue and status (queued, running), as of the supervisor's last tick.",
            ["queue", "status"],
            registry=self.registry,
        )
        self.turns = Counter("animegamer_turns", "Turns ended, by outcome.", ["outcome"], registry=self.registry)
        self.delivery_retries = Counter(
            "animegamer_delivery_retries",
            "Clip posts that failed for a reason that may pass and were scheduled again.",
            registry=self.registry,
        )
        self.undeliverable = Counter(
            "animegamer_delivery_undeliverable",
            "Finished turns whose clip will never be posted (refused for good, or too many failures).",
            registry=self.registry,
        )
        self.results_rejected = Counter(
            "animegamer_results_rejected",
            "Results stored for a turn without the proof of the worker given it (game/proof.py): forged, and dropped.",
            registry=self.registry,
        )
        self.clip_safety = Counter(
            "animegamer_clip_safety",
            "Clips the nudity check had a say on, by decision.",
            ["decision"],
            registry=self.registry,
        )
        self.oldest_wait = Gauge(
            "animegamer_queue_oldest_wait_seconds",
            "Seconds the oldest turn not yet started has waited, by queue (0: none waiting), as of the last tick.",
            ["queue"],
            registry=self.registry,
        )
        for outcome in OUTCOMES:  # present at 0, so rate() and alerts see a series before the first one
            self.turns.labels(outcome)
        for decision in SAFETY_DECISIONS:
            self.clip_safety.labels(decision)
        self._waiting: dict[int, tuple[float, str]] = {}  # interaction id -> (received, command label)
        self._queues_seen: set[tuple[str, str]] = set()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- the endpoint ------------------------------------------------------------------------------

    def serve(self, port: int, address: str, ready: Ready | None = None, live: Ready | None = None) -> None:
        """Serve /metrics on ``port`` (0: not at all), and /healthz, /readyz and /livez beside it when ``ready`` is
        given (bot/health.py, bot/liveness.py). A port taken is logged, not fatal: play goes on."""
        if not port:
            return
        try:
            self._server, self._thread = start_http_server(port, address, registry=self.registry)
        except OSError as exc:
            log.error("metrics endpoint not started on %s:%s (%s)", address, port, exc)
            return
        if ready is not None:
            self._server.set_app(with_health(self._server.get_app(), ready, live))
        log.info("metrics served on %s:%s/metrics (and /healthz, /readyz, /livez)", address, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- first answers -----------------------------------------------------------------------------

    def received(self, interaction: discord.Interaction) -> None:
        """Note when an interaction arrived; called before any handler of it runs."""
        if len(self._waiting) >= WAITING_LIMIT:  # never answered (expired, failed): forget the oldest
            del self._waiting[next(iter(self._waiting))]
        self._waiting[interaction.id] = (time.monotonic(), command_label(interaction))

    def http_trace(self) -> aiohttp.TraceConfig:
        """An aiohttp trace for discord.py's session: every first answer is an interaction callback request."""
        trace = aiohttp.TraceConfig()

        async def on_request_end(
            _session: aiohttp.ClientSession, _context: SimpleNamespace, params: aiohttp.TraceRequestEndParams
        ) -> None:
            found = CALLBACK.search(params.url.path)
            if found is None or params.response.status >= 300:
                return
            waiting = self._waiting.pop(int(found["id"]), None)
            if waiting is not None:
                received, command = waiting
                self.first_answer.labels(command).observe(time.monotonic() - received)

        trace.on_request_end.append(on_request_end)
        return trace

    # -- jobs and turns ----------------------------------------------------------------------------

    def queue_depth(self, settings: Settings, in_flight: Iterable[JobInfo]) -> None:
        """Set queued/running per queue, and the oldest wait, from the jobs the supervisor just read; a queue
        emptied reads 0. A turn waits from when it was queued, sent or not (with no worker it waits unsent); a
        story turn only from when it was sent, since until then it waited for the turn before it."""
        counts = {(queue, str(status)): 0 for queue in served_queues(settings) for status in IN_FLIGHT}
        counts.update(dict.fromkeys(self._queues_seen, 0))
        now = utcnow()
        oldest = {queue: 0.0 for queue, _ in counts}
        for job in in_flight:
            queue = queue_of_stored(settings, job.instruction)
            key = (queue, str(job.status))
            counts[key] = counts.get(key, 0) + 1
            since = job.queued_at if job.story_id is None else job.sent_at
            if job.status is JobStatus.QUEUED and since is not None:
                oldest[queue] = max(oldest.get(queue, 0.0), (now - since).total_seconds())
        for (queue, status), count in counts.items():
            self.queue_jobs.labels(queue, status).set(count)
        for queue, seconds in oldest.items():
            self.oldest_wait.labels(queue).set(seconds)
        self._queues_seen = set(counts)

    def turn_ended(self, outcome: str, count: int = 1) -> None:
        """A turn's final move committed (``OUTCOMES``); call once per job whose move matched."""
        self.turns.labels(outcome).inc(count)

    def watch(self, bot: AnimeGamerBot) -> None:
        """Export, at each scrape, the state of ``bot`` that the alerts page on (``LiveState``)."""
        self.registry.register(LiveState(bot))


class LiveState(Collector):
    """Read at scrape time, from the HTTP server's thread: only attributes the loop sets, never awaiting it."""

    def __init__(self, bot: AnimeGamerBot) -> None:
        self.bot = bot

    def collect(self) -> Iterator[Metric]:
        bot, now = self.bot, time.monotonic()
        shards = GaugeMetricFamily(
            "animegamer_shard_disconnected_seconds",
            "Seconds each shard of this process has been without its gateway (0: connected).",
            labels=["shard"],
        )
        lost, known, once = dict(bot.disconnected), bot.connected_shards(), set(bot.connected_once)
        for shard in sorted(set(known[1] if known else ()) | set(lost)):
            # A shard that never connected (a start during a gateway outage) is down since the process started.
            since = lost.get(shard, None if shard in once else bot.started_at)
            shards.add_metric([str(shard)], 0.0 if since is None else round(now - since, 1))
        yield shards
        workers = GaugeMetricFamily(
            "animegamer_queue_workers",
            "Live workers consuming each queue this bot sends to, as they announce themselves.",
            labels=["queue"],
        )
        live = dict(bot.presence.workers_on)
        for queue in served_queues(bot.settings):
            workers.add_metric([queue], live.get(queue, 0))
        yield workers
        if (memory := bot.presence.broker_memory) is not None:
            used, limit = memory
            yield GaugeMetricFamily("animegamer_broker_memory_used_bytes", "The Redis broker's memory in use.", used)
            yield GaugeMetricFamily(
                "animegamer_broker_memory_max_bytes", "The Redis broker's maxmemory (0: no limit).", limit
            )
        failures = CounterMetricFamily(
            "animegamer_clip_store_failures",
            "Clip store operations that failed or were refused (a store down, a full disk), by operation.",
            labels=["operation"],
        )
        counted = dict(bot.clips.failures)
        for operation in sorted(set(STORE_OPERATIONS) | set(counted)):
            failures.add_metric([operation], counted.get(operation, 0))
        yield failures


def command_label(interaction: discord.Interaction) -> str:
    """A bounded name for what was used: "act", "admin ban", "start (autocomplete)", "ag:turn:#:reroll"."""
    data = interaction.data or {}
    if interaction.type in (discord.InteractionType.application_command, discord.InteractionType.autocomplete):
        parts, options = [str(data.get("name", "?"))], data.get("options") or []
        while options and options[0].get("type") in (SUBCOMMAND, SUBCOMMAND_GROUP):
            parts.append(str(options[0].get("name", "?")))
            options = options[0].get("options") or []
        suffix = " (autocomplete)" if interaction.type is discord.InteractionType.autocomplete else ""
        return " ".join(parts) + suffix
    custom_id = str(data.get("custom_id", ""))
    if custom_id.startswith("ag:"):  # ours: job ids become '#', so one button is one series
        return re.sub(r"\d+", "#", custom_id)[:100]
    return "modal" if interaction.type is discord.InteractionType.modal_submit else "component"
