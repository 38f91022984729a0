"""A story's recap clip, made once per version of the story and kept in the clip store until the story moves on.

Joining a long story (and shrinking it under the upload limit) takes seconds to a minute of CPU, so the result is
kept: a second /story recap with no new turn posts it again without encoding. Its key carries a digest of the turns
it holds and the limit it was fitted to, so a new turn, a turn removed (a player's data purged) or a different limit
each make a new one, and the story's older ones are deleted as soon as a new one is made. Kept in the clip store,
beside the clips, a recap one bot process made is reused by the others, and /story end or /admin purge in any
process deletes it. Its key is ``<game>/recaps/story_<id>_<version>.mp4``: another game's story of the same id, on
the same bucket, is never read or deleted. (Clip keys are ``<game>/<guild>/...``: no guild is called ``recaps``.)

The joining itself works on local copies in a folder of the caller's (``work``), in bounded memory: files are
read and written by path, never held whole. Blocking file and CPU work: call through `asyncio.to_thread`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from bot.clip_store import ClipStore
from db.clip_deletes import EVERY
from media.clips import ClipTooLarge, fit_file, join_files

logger = logging.getLogger(__name__)

RECAPS = "recaps/"
TOO_LARGE = ".toolarge"  # a version that does not fit even re-encoded: remembered, so it is not encoded again
# A recap being made longer than this is its process's death, not its work: its claim (db/recaps.py) may be
# taken again. Joining and fitting a long story takes about a minute.
RECAP_STALE = timedelta(minutes=10)


def _stem(store: ClipStore, story_id: int) -> str:
    return f"{store.game}/{RECAPS}story_{story_id}_" if store.game else f"{RECAPS}story_{story_id}_"


def _version(turn_ids: Sequence[int], limit_bytes: int) -> str:
    text = f"{limit_bytes}:" + ",".join(str(turn_id) for turn_id in turn_ids)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recap_key(store: ClipStore, story_id: int, turn_ids: Sequence[int], limit_bytes: int) -> str:
    """The key of the kept recap of these turns fitted to this limit."""
    return f"{_stem(store, story_id)}{_version(turn_ids, limit_bytes)}.mp4"


def forget(store: ClipStore, story_id: int) -> None:
    """Delete every kept recap of the story (and its too-large marks) now: older versions, when a new one is made."""
    store.delete(store.keys(_stem(store, story_id)))


def every_recap(store: ClipStore, story_id: int) -> str:
    """The owed key that stands for every kept recap of the story (``db/clip_deletes.py``), for a deletion that
    must outlive an outage of the store: a story ended, a player's turns deleted."""
    return _stem(store, story_id) + EVERY


def recap_file(
    store: ClipStore, story_id: int, clips: Sequence[tuple[int, str]], limit_bytes: int, work: Path
) -> tuple[Path, bool]:
    """The story's recap MP4 under `limit_bytes` as a file in `work`, and whether it was made now (False: the kept
    one reused).

    `clips` are (turn id, clip key) in story order. Raises ClipTooLarge when the joined clip does not fit even
    re-encoded (remembered for this version too), ValueError when there is nothing to join, FileNotFoundError when
    a clip is gone from the store.
    """
    if not clips:
        raise ValueError("the story has no clips to join")
    final = recap_key(store, story_id, [turn_id for turn_id, _ in clips], limit_bytes)
    too_large = final.removesuffix(".mp4") + TOO_LARGE
    recap = work / "recap.mp4"
    if store.exists(final):
        store.copy_to(final, recap)
        return recap, False
    if store.exists(too_large):
        raise ClipTooLarge(*(int(n) for n in store.get(too_large).decode().split()))
    forget(store, story_id)  # older versions: their space is needed more than they are
    local = []
    for turn_id, key in clips:
        local.append(work / f"turn_{turn_id}.mp4")
        store.copy_to(key, local[-1])
    joined = work / "joined.mp4"
    how = join_files(local, joined)
    try:
        fitted = fit_file(joined, limit_bytes, recap)
    except ClipTooLarge as exc:
        store.put(too_large, f"{exc.original_bytes} {exc.smallest_bytes} {exc.limit_bytes}".encode())
        raise
    store.put_file(final, fitted)  # whole or not at all: no half recap is ever reused
    logger.info("story %s: recap of %d clips made (%s), %d bytes", story_id, len(clips), how, fitted.stat().st_size)
    return fitted, True
