"""`animegamer check [--worker] [--json]`: test this machine's configuration before a player waits on it.

One line per check, with what to do when it fails (animegamer/checks.py). Exit 0 when none fails (warnings
allowed), 1 otherwise; ``--json`` prints the results as one JSON list for scripts and health probes.
"""

from __future__ import annotations

import argparse
import json

from relay.settings import Settings

MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("check", help="test the configuration: database, queue, blobs, workers, token, disk")
    parser.description = __doc__
    parser.add_argument("--worker", action="store_true", help="check only what a worker's machine needs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from animegamer.checks import run_checks

    results = run_checks(settings, "worker" if args.worker else "bot")
    if args.json:
        print(json.dumps([result.as_dict() for result in results], indent=2))
    else:
        width = max(len(result.name) for result in results)
        for result in results:
            fix = f"  -> {result.fix}" if result.status != "ok" and result.fix else ""
            print(f"{MARKS[result.status]}  {result.name:<{width}}  {result.detail}{fix}")
    return 1 if any(result.status == "fail" for result in results) else 0
