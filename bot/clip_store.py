"""Where the bot keeps finished clips: one folder, and rows that name each clip by its key in it.

A row keeps the key (``<guild>/job_<id>.mp4``), never a path: a bot started from another working directory, or
moved to another machine with its data folder, still finds every clip (revision 0007 turned the paths stored
before into keys). Only the bot reads clips; the workers send theirs through the blob store.

Bot processes of one game share one folder (ANIMEGAMER_CLIP_DIR): the process that applies a result writes its
clip, and whichever process posts it, or later joins it into a recap, reads it there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from relay.settings import Settings

log = logging.getLogger(__name__)


class ClipStore:
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()  # fixed at start: a later change of working directory moves nothing

    @classmethod
    def of(cls, settings: Settings) -> ClipStore:
        return cls(settings.clip_dir or settings.data_dir / "clips")

    @staticmethod
    def key(guild_id: int | None, job_id: int) -> str:
        return f"{guild_id}/job_{job_id}.mp4"

    def path(self, key: str) -> Path:
        """The clip's file. A row older than keys that revision 0007 could not read as one keeps its absolute
        path, which this returns unchanged."""
        return self.root / key

    def delete(self, keys: Iterable[str]) -> list[str]:
        """Delete each clip; returns the keys whose file was already gone. A file we may not delete stays."""
        missing = []
        for key in keys:
            try:
                self.path(key).unlink()
            except FileNotFoundError:
                missing.append(key)
            except OSError as exc:
                log.warning("clip %s not deleted (%s)", key, exc)
        return missing
