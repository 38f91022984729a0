"""A story's recap clip, made once per version of the story and kept on disk until the story moves on.

Joining a long story (and shrinking it under the upload limit) takes seconds to a minute of CPU, so the file is
kept: a second /story recap with no new turn posts it again without encoding. The file's name carries a digest of
the turns it holds and the limit it was fitted to, so a new turn, a turn removed (a player's data purged) or a
different limit each make a new file, and the story's older files are deleted as soon as a new one is made.

Blocking file and CPU work: call through `asyncio.to_thread`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from media.clips import ClipTooLarge, fit_file, join_files

logger = logging.getLogger(__name__)

TOO_LARGE = ".toolarge"  # a version that does not fit even re-encoded: remembered, so it is not encoded again
# A recap being made longer than this is its process's death, not its work: its claim (db/recaps.py) may be
# taken again, and its work folder deleted. Joining and fitting a long story takes about a minute.
RECAP_STALE = timedelta(minutes=10)


def folder_in(clip_root: Path) -> Path:
    """Where the bot keeps recap files: /story recap makes them, /story end and /admin purge delete them.

    Inside the clip folder, which every bot process of one game shares: a recap one process made is reused by the
    others, and /story end or /admin purge in any process deletes it. (Clip keys are ``<guild>/...``: no guild is
    called ``recaps``.)
    """
    return clip_root / "recaps"


def _stem(story_id: int) -> str:
    return f"story_{story_id}_"


def _version(turn_ids: Sequence[int], limit_bytes: int) -> str:
    text = f"{limit_bytes}:" + ",".join(str(turn_id) for turn_id in turn_ids)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def forget(folder: Path, story_id: int) -> None:
    """Delete every recap file of the story, and any work folder a stopped bot left behind.

    A work folder younger than ``RECAP_STALE`` may be another process's recap being made: it is left to that
    process, which moves its file into place and removes its folder.
    """
    if not folder.is_dir():
        return
    for path in folder.glob(_stem(story_id) + "*"):
        path.unlink(missing_ok=True)
    stale = time.time() - RECAP_STALE.total_seconds()
    for work in folder.glob("." + _stem(story_id) + "*"):
        try:
            if work.stat().st_mtime < stale:
                shutil.rmtree(work, ignore_errors=True)
        except FileNotFoundError:  # its process finished with it meanwhile
            continue


def recap_file(folder: Path, story_id: int, clips: Sequence[tuple[int, Path]], limit_bytes: int) -> tuple[Path, bool]:
    """The story's recap MP4 under `limit_bytes`, and whether it was made now (False: the kept one reused).

    `clips` are (turn id, clip file) in story order. Raises ClipTooLarge when the joined clip does not fit even
    re-encoded (remembered for this version too), ValueError when there is nothing to join.
    """
    if not clips:
        raise ValueError("the story has no clips to join")
    stem = _stem(story_id) + _version([turn_id for turn_id, _ in clips], limit_bytes)
    final = folder / f"{stem}.mp4"
    too_large = folder / f"{stem}{TOO_LARGE}"
    if final.is_file():
        return final, False
    if too_large.is_file():
        raise ClipTooLarge(*(int(n) for n in too_large.read_text().split()))
    folder.mkdir(parents=True, exist_ok=True)
    forget(folder, story_id)  # older versions: their disk space is needed more than they are
    # Work beside the final file, so the finished one is moved into place whole (no half file is ever posted).
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{stem}-") as work:
        joined = Path(work, "joined.mp4")
        how = join_files([path for _, path in clips], joined)
        try:
            fitted = fit_file(joined, limit_bytes, Path(work, "fitted.mp4"))
        except ClipTooLarge as exc:
            too_large.write_text(f"{exc.original_bytes} {exc.smallest_bytes} {exc.limit_bytes}")
            raise
        os.replace(fitted, final)
    logger.info("story %s: recap of %d clips made (%s), %d bytes", story_id, len(clips), how, final.stat().st_size)
    return final, True
