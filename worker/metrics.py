"""What an operator watches on a worker: a Prometheus endpoint, off unless ANIMEGAMER_WORKER_METRICS_PORT is set.

The pool's child serves it, not the parent. The child is the process that runs the turns and holds
the GPU, so its own registry has the stage times and the memory, with no files shared between
processes (prometheus_client's multiprocess mode) and no torch in the parent. A child killed at the
hard time limit takes its endpoint with it; the fresh child the pool forks binds the same port
again as it starts (``serve``, before it loads the model), so the endpoint is back within seconds.
Counts start again from zero in the new child, which Prometheus reads as a counter reset
(``rate`` and ``increase`` handle it). With one child per worker (``animegamer worker`` runs
concurrency 1, one worker per GPU) there is one endpoint per worker; workers sharing a machine
need one port each.

It also writes the worker's line for a failed job, with the job id (Celery's names only the task id).

This module never imports torch: GPU memory is read only where the child already imported it and
CUDA is initialised; on a CPU worker those series are absent.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

from celery import signals
from prometheus_client import REGISTRY, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from relay.probes import Ready, with_health

log = logging.getLogger(__name__)

# A toy turn's stages take milliseconds; a published one's denoising takes minutes.
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

STAGE_SECONDS = Histogram(
    "animegamer_turn_stage_seconds",
    "Seconds each stage of a finished turn took on this worker (prompt, state_pass, denoise, vae, encode, ...).",
    ["stage"],
    buckets=STAGE_BUCKETS,
)
GPU_PEAK = Gauge(
    "animegamer_gpu_memory_peak_bytes",
    "The most GPU memory torch held during the last finished turn, by device (absent on CPU workers).",
    ["device"],
)


class GpuMemory(Collector):
    """GPU memory held now, read at scrape time (absent unless this process already uses CUDA)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cuda = _cuda()
        if cuda is None:
            return
        allocated = GaugeMetricFamily(
            "animegamer_gpu_memory_allocated_bytes", "GPU memory held by torch's tensors now.", labels=["device"]
        )
        reserved = GaugeMetricFamily(
            "animegamer_gpu_memory_reserved_bytes", "GPU memory torch's caching allocator holds now.", labels=["device"]
        )
        for index in range(cuda.device_count()):
            allocated.add_metric([f"cuda:{index}"], cuda.memory_allocated(index))
            reserved.add_metric([f"cuda:{index}"], cuda.memory_reserved(index))
        yield allocated
        yield reserved


def _cuda() -> Any:
    """torch.cuda if this process imported torch and initialised CUDA; never imports or initialises either."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():  # a flag: asks no driver anything
        return None
    return torch.cuda


REGISTRY.register(GpuMemory())


def serve(port: int, address: str, ready: Ready | None = None, live: Ready | None = None) -> None:
    """Serve /metrics from this process (a pool child, as it starts), and /healthz, /readyz and /livez beside it
    when ``ready`` is given; 0: not at all. A port taken is logged, not fatal: the worker still makes turns.
    """
    if not port:
        return
    try:
        server, _ = start_http_server(port, address)
    except OSError as exc:
        log.error("metrics endpoint not started on %s:%s (%s)", address, port, exc)
        return
    if ready is not None:
        server.set_app(with_health(server.get_app(), ready, live))
    log.info("metrics served on %s:%s/metrics (and /healthz, /readyz, /livez)", address, port)


def observe_turn(timings: dict[str, float]) -> None:
    """A turn finished: its stage times, and the most GPU memory it held (then counted afresh for the next)."""
    for stage, seconds in timings.items():
        STAGE_SECONDS.labels(stage).observe(seconds)
    cuda = _cuda()
    if cuda is not None:
        for index in range(cuda.device_count()):
            GPU_PEAK.labels(f"cuda:{index}").set(cuda.max_memory_allocated(index))
            cuda.reset_peak_memory_stats(index)


@signals.task_failure.connect
def _log_failure(args: tuple[Any, ...] | None = None, exception: BaseException | None = None, **_: Any) -> None:
    """Celery's own failure line names the task id; this one names the job, as every job line does."""
    request = args[0] if args else None
    job_id = request.get("job_id", "?") if isinstance(request, dict) else "?"
    log.error("job %s failed: %s: %s", job_id, type(exception).__name__, exception)
