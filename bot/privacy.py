"""What follows a deletion of a player's data once its rows are gone: their stored clips, the recaps and story pages
posted with their clips, the kept recaps of their stories, and their turns still with the workers.

One path for an admin's ``/admin purge`` and a player's ``/mydata delete``. The store's deletions were recorded in
the transaction that deleted the rows (db/clip_deletes.py) and the copies withdrawn in it (db/clip_copies.py), so
whatever fails here is retried by every bot process's retention loop; a turn still being made finds no job when
its result arrives and is never applied or posted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.clip_copies import take_down_withdrawn
from bot.clip_deletes import delete_owed, owe
from bot.queue import QueueUnavailable, TurnQueue
from bot.recaps import every_recap
from db.clip_deletes import EVERY

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Left:
    """What a deletion could not take away now, each retried every minute until it is done."""

    owed: list[str]  # keys owed to the store (a story's kept recaps as one, ``every_recap``)
    copies: int  # posted recap and story page messages Discord did not delete now


async def after_deletion(bot: AnimeGamerBot, clip_keys: Sequence[str], copies: int, stories: Sequence[int]) -> Left:
    """Delete what the deleted rows left outside the database; returns what is still to go."""
    owed = await delete_owed(bot.sessions, bot.clips, list(clip_keys))
    copies_left = await take_down_withdrawn(bot, bot.sessions) if copies else 0
    # A kept recap shows their turns too; the next /story recap makes a new one.
    owed += await owe(bot.sessions, bot.clips, [every_recap(bot.clips, story_id) for story_id in stories])
    return Left(owed, min(copies_left, copies))


async def cancel_sent(queue: TurnQueue, task_ids: Sequence[str]) -> None:
    """Take the deleted turns still queued out of the broker, and mark those a worker has as cancelled: after
    answering, since a broker can take seconds to refuse. Their rows are gone already, so a result that still
    arrives finds no job and is never posted."""
    try:
        await queue.withdraw(task_ids)
    except QueueUnavailable:
        log.info("deleted turns not taken out of the queue; their workers find the cancel marks")
    for task_id in task_ids:
        try:
            await queue.cancel(task_id)
        except QueueUnavailable:
            log.info("cancel of deleted turn %s not marked; its result finds no job", task_id)


def deleted_text(clips: int, left: Left, copies: int) -> str:
    """The part of an answer that says what went from outside the database and what is still to go."""
    files = [key for key in left.owed if not key.endswith(EVERY)]
    said = f"{clips - len(files)} clip file(s)"
    if copies:
        said += f", and {copies - left.copies} recap or story page message(s) that held them"
    said += "."
    if files:
        said += f" {len(files)} more clip file(s) will be deleted as soon as the clip store answers."
    if recaps := len(left.owed) - len(files):
        said += f" The kept recaps of {recaps} story(ies) will be deleted as soon as the clip store answers."
    if left.copies:
        said += f" {left.copies} more recap or story page message(s) will be deleted on a later try."
    return said
