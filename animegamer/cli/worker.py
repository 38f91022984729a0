"""`animegamer worker`: a Celery worker for the configured broker, one turn at a time.

The pool is `prefork` with one child (one worker per GPU): the child runs the turns, and
Celery's hard time limit (ANIMEGAMER_TASK_TIME_LIMIT) kills a child whose turn hangs, reports
the turn failed and forks a fresh child, where the `solo` pool could only wait forever.

Where the model is loaded: on the CPU, once in the parent before the pool forks, so every child
(the first, and one that replaces a killed child) shares it without loading again. On a GPU,
in each child as it starts (CUDA cannot cross a fork), after the parent checked what it can
without touching the GPU. SIGKILL of the whole worker leaves its turn to the bot, which sees
the turn's claim lapse and sends it again.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from animegamer.settings import Settings

log = logging.getLogger(__name__)


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
    # torch.cuda.is_available() through NVML: the parent must not initialise CUDA before it forks.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    from celery import signals

    from worker.celery_app import BrokerUnavailable, app, check_broker, served_queues
    from worker.pipeline.pipeline import PipelineLoadError, resolve_device
    from worker.tasks import generate_turn

    settings.data_dir.mkdir(parents=True, exist_ok=True)  # the embedded broker's and results' files live there
    # A finished turn is worth waiting for: a worker stores its result through a result store that
    # went away (a Redis restart) for minutes, where the bot's reads give up in seconds.
    app.conf.result_backend_always_retry = True
    app.conf.result_backend_max_retries = 60
    app.conf.result_backend_transport_options = {
        "retry_policy": {"max_retries": 60, "interval_start": 0, "interval_step": 1, "interval_max": 5}
    }
    try:
        check_broker(app, settings.broker_timeout)
        on_cpu = resolve_device(settings.device) == "cpu"
    except (BrokerUnavailable, PipelineLoadError) as exc:
        print(exc, file=sys.stderr)
        return 1
    if not args.no_preload:
        try:
            if on_cpu:
                generate_turn.pipelines  # noqa: B018 - load once, in the parent: every child shares it
            else:
                check_release_files(settings)
        except PipelineLoadError as exc:
            print(exc, file=sys.stderr)
            return 1

    @signals.worker_process_init.connect(weak=False)
    def start_child(**_: Any) -> None:
        generate_turn.reset_after_fork()
        if not args.no_preload and not on_cpu:
            try:
                generate_turn.pipelines  # noqa: B018 - on a GPU each child loads its own copy
            except PipelineLoadError:
                log.exception("the model did not load in the pool's child; its turns will fail")
        generate_turn.heartbeat  # noqa: B018 - announce this worker's queues, renew its claims

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


def check_release_files(settings: Settings) -> None:
    """What the parent can check of the published model without a GPU: every file there, whole, of the right sizes."""
    from worker.celery_app import RELEASE_MODEL
    from worker.pipeline.checkpoints.load import check
    from worker.pipeline.pipeline import PipelineLoadError

    if settings.model != RELEASE_MODEL:
        return
    failed = [report for report in check(settings.checkpoints, tuple(settings.characters)) if not report.ok]
    if failed:
        raise PipelineLoadError("\n".join(line for report in failed for line in report.lines))
