"""`animegamer worker`: a Celery worker for the configured broker, one turn at a time.

The pool is `solo`: one process holds the model (one worker per GPU), and SIGKILL of that
process leaves its unacknowledged turn to be redelivered after the visibility timeout.
"""

from __future__ import annotations

import argparse
import os
import sys

from animegamer.settings import Settings


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
    from worker.celery_app import BrokerUnavailable, app, check_broker, served_queues
    from worker.tasks import generate_turn

    try:
        check_broker(app, settings.broker_timeout)
    except BrokerUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    if not args.no_preload:
        from worker.pipeline.pipeline import PipelineLoadError

        try:
            generate_turn.pipelines  # noqa: B018 - load once, now, so a broken model fails at start
        except PipelineLoadError as exc:
            print(exc, file=sys.stderr)
            return 1
    argv = [
        "worker",
        "--pool=solo",
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
