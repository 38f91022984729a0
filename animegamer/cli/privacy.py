"""`animegamer privacy delete-user USER_ID`: Discord's request to delete a user's data (a deleted account, or a
request sent to the operator), whole: every row of theirs in every server, the bans on them and their id in the
audit log included, and their stored clips. A player's own request is /mydata delete (docs/privacy.md).

Run it where the bot's settings are (the same database and clip store). The posted recaps and story pages that
held their clips are withdrawn here and deleted by the running bot within a minute; clips the store cannot delete
now are recorded and deleted by the bot as soon as it answers.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from relay.settings import Settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("privacy", help="delete a user's data on Discord's request", description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    delete = actions.add_parser("delete-user", help="delete everything kept about a Discord user id")
    delete.add_argument("user_id", type=int, help="the Discord user id (a number)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if not 0 < args.user_id < 2**63:
        print(f"{args.user_id} is not a Discord user id", file=sys.stderr)
        return 2
    return asyncio.run(delete_user(args.user_id, settings))


async def delete_user(user_id: int, settings: Settings) -> int:
    from bot.clip_deletes import delete_owed, owe
    from bot.clip_store import ClipStore
    from bot.privacy import cancel_sent
    from bot.queue import TurnQueue
    from bot.recaps import every_recap
    from db import privacy
    from db.engine import make_engine, make_sessionmaker
    from db.queries import game_id
    from relay.celery_app import make_celery

    engine = make_engine(settings.database_url)
    try:
        sessions = make_sessionmaker(engine)
        async with sessions() as session, session.begin():
            deleted = await privacy.delete_user(session, user_id, whole=True)
            game = await game_id(session)
        store = ClipStore.of(settings)
        store.game = game
        owed = await delete_owed(sessions, store, deleted.clip_keys)
        recaps = await owe(sessions, store, [every_recap(store, story_id) for story_id in deleted.stories])
        # Their turns still queued: out of the broker, or marked cancelled for the worker that has one.
        await cancel_sent(TurnQueue(make_celery(settings), settings.broker_timeout), deleted.task_ids)
    finally:
        await engine.dispose()
    print(
        f"Deleted user {user_id}: {deleted.rows} row(s) and {len(deleted.clip_keys) - len(owed)} clip file(s); "
        f"{deleted.copies} posted recap or story page message(s) go within a minute of the bot's next look."
        + (f" {len(owed)} clip file(s) are owed to the store until it answers." if owed else "")
        + (f" The kept recaps of {len(recaps)} story(ies) are owed to it too." if recaps else "")
    )
    return 0
