"""`animegamer db upgrade|downgrade`: the schema only ever changes through Alembic."""

from __future__ import annotations

import argparse
import sys

from relay.settings import Settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("db", help="migrate the game database", description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("upgrade", help="migrate to a revision (default: head)")
    up.add_argument("revision", nargs="?", default="head")
    down = actions.add_parser("downgrade", help="migrate back to a revision (base: drop everything)")
    down.add_argument("revision")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from db.engine import DatabaseFileError
    from db.migrate import downgrade, upgrade

    try:
        if args.action == "upgrade":
            upgrade(settings.database_url, args.revision)
        else:
            downgrade(settings.database_url, args.revision)
    except DatabaseFileError as exc:
        print(exc, file=sys.stderr)
        return 1
    from sqlalchemy.engine import make_url

    print(f"Database at {args.revision}: {make_url(settings.database_url).render_as_string(hide_password=True)}")
    return 0
