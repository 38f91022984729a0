"""`animegamer db upgrade|downgrade|backup`: the schema only ever changes through Alembic; a backup is a
consistent copy of the live SQLite file, taken while the bot plays."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relay.settings import Settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("db", help="migrate the game database", description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("upgrade", help="migrate to a revision (default: head)")
    up.add_argument("revision", nargs="?", default="head")
    down = actions.add_parser("downgrade", help="migrate back to a revision (base: drop everything)")
    down.add_argument("revision")
    backup = actions.add_parser("backup", help="copy the live SQLite database, consistently, to a new file")
    backup.add_argument("path", type=Path, help="the copy's file (never overwritten)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "backup":
        return backup(args.path, settings)
    from db.engine import DatabaseFileError
    from db.migrate import DatabaseRefused, downgrade, upgrade

    try:
        if args.action == "upgrade":
            upgrade(settings.database_url, args.revision)
        else:
            downgrade(settings.database_url, args.revision)
    except (DatabaseFileError, DatabaseRefused) as exc:
        print(exc, file=sys.stderr)
        return 1
    from sqlalchemy.engine import make_url

    print(f"Database at {args.revision}: {make_url(settings.database_url).render_as_string(hide_password=True)}")
    return 0


def backup(path: Path, settings: Settings) -> int:
    from db.backup import BackupError, backup_sqlite

    try:
        made = backup_sqlite(settings.database_url, path)
    except BackupError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"Backed up {made.turns} turns (schema {made.revision}, {made.bytes / 1e6:.1f} MB) to {made.path}")
    return 0
