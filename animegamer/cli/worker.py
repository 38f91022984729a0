"""`animegamer worker`: a Celery worker for the configured broker, one turn at a time.

The pool is `prefork` with one child (one worker per GPU): the child runs the turns, and
Celery's hard time limit (ANIMEGAMER_TASK_TIME_LIMIT) kills a child whose turn hangs, reports
the turn failed and forks a fresh child, where the `solo` pool could only wait forever.

The model is loaded in the child, as it starts; the parent never runs torch. A process that
forks after torch computed (on the CPU, its OpenMP threads; on a GPU, its CUDA context) leaves
a child that hangs on its first operation. So the parent checks only what it can without
computing (the model's name, the toy model's file), and a child
that still cannot load the model stops the whole worker, its reason in the log.

Stopping: SIGTERM to the main process (`docker stop`) finishes the turn in hand, then exits (Celery's
warm shutdown); SIGTERM to every process at once (systemd's default KillMode=control-group) hands the
turn back at its next step, for the next worker, and exits (``worker.tasks.stop_at_next_step``).
SIGKILL of the whole worker leaves its turn to the bot, which sees the turn's claim lapse and sends
it again.

With ANIMEGAMER_WORKER_METRICS_PORT set, each child serves /metrics as it starts (`worker.metrics`),
so the child forked after a hard time limit serves it again.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from typing import Any

from relay.settings import Settings

log = logging.getLogger(__name__)

TAKES_TURNS = "model loaded and announced: this pool process takes turns now"
CHILD_START_SECONDS = 1800.0  # a pool child loads the model before it reports alive: the published one takes minutes


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("worker", help="run a GPU/CPU worker for the configured queue", description=__doc__)
    parser.add_argument("--loglevel", default="INFO", help="Celery log level (default INFO)")
    parser.add_argument(
        "--queues",
        default=None,
        help="comma-separated queues (default: ANIMEGAMER_QUEUE, one per character for the published model)",
    )
    parser.add_argument(
        "--no-preload", action="store_true", help="load the model on the first turn instead of at start"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from celery import signals

    from relay.celery_app import BrokerUnavailable, check_broker, make_celery, served_queues
    from worker import metrics
    from worker.pipeline.pipeline import PipelineLoadError
    from worker.tasks import BrokerWatch, generate_turn, readiness  # a shared task: it joins the app made here

    app = make_celery(settings)

    settings.data_dir.mkdir(parents=True, exist_ok=True)  # the embedded broker's and results' files live there
    # A finished turn is worth waiting for: a worker stores its result through a result store that
    # went away (a Redis restart) for minutes, where the bot's reads give up in seconds.
    app.conf.result_backend_always_retry = True
    app.conf.result_backend_max_retries = 60
    app.conf.result_backend_transport_options = {
        "retry_policy": {"max_retries": 60, "interval_start": 0, "interval_step": 1, "interval_max": 5}
    }
    app.conf.worker_proc_alive_timeout = CHILD_START_SECONDS
    try:
        check_broker(app, settings.broker_timeout)
        check_model(settings)
    except (BrokerUnavailable, PipelineLoadError) as exc:
        print(exc, file=sys.stderr)
        return 1

    def live() -> tuple[bool, dict[str, Any]]:  # stuck: a turn with no step, or a heartbeat round, for the stall limit
        return generate_turn.watch.report()

    @signals.worker_process_init.connect(weak=False)
    def start_child(**_: Any) -> None:
        queues = args.queues.split(",") if args.queues else served_queues(settings)
        ready = functools.partial(readiness, settings.model, queues, not args.no_preload, BrokerWatch())
        metrics.serve(settings.worker_metrics_port, settings.metrics_address, ready, live)  # a fresh child: again
        generate_turn.reset_after_fork()
        if not args.no_preload:
            try:
                generate_turn.pipelines  # noqa: B018 - once per child, before its first turn
            except PipelineLoadError as exc:
                log.critical("the model did not load, so this worker stops: %s", exc)
                os.kill(os.getppid(), signal.SIGTERM)
                return
        generate_turn.heartbeat  # noqa: B018 - announce this worker's queues, renew its claims
        # Celery says "ready." as the pool starts, before its process has loaded the model: this line is the moment
        # the worker is announced and takes turns (tests/workers.py waits for it).
        log.info("%s (queues %s)", TAKES_TURNS, ", ".join(queues))

    argv = [
        "worker",
        "--pool=prefork",
        "--concurrency=1",
        f"--loglevel={args.loglevel}",
        "-Q",
        args.queues or ",".join(served_queues(settings)),
        # A node name of its own: several workers on one host (one per GPU) must answer inspect() apart.
        "-n",
        f"animegamer-{os.getpid()}@%h",
    ]
    if settings.broker_url.startswith("sqla+"):
        argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]  # no broadcast over SQLite
    app.worker_main(argv)
    return 0


def check_model(settings: Settings) -> None:
    """What the parent can check of the model without computing with torch; PipelineLoadError names the problem.

    The published files are checked by the child as it loads them (`animegamer checkpoints check` checks
    them beforehand): reading 25 GB of tensors here would put torch to work in the parent.
    """
    from worker.pipeline.config import TOY, UnknownModelError, check_model_name
    from worker.pipeline.pipeline import PipelineLoadError

    try:
        check_model_name(settings.model)
    except UnknownModelError as exc:
        raise PipelineLoadError(str(exc)) from exc
    if settings.model == TOY:
        from worker.pipeline.toy import SHIPPED, ToyCheckpointError, read_toy_checkpoint

        try:
            read_toy_checkpoint(SHIPPED, header_only=True)
        except ToyCheckpointError as exc:
            raise PipelineLoadError(str(exc)) from exc
