"""The blob store: clips and representations too large for the queue, kept as files the bot and the workers share.

At the published sizes a turn's representation is 868 KB (226 x 1920 float16) and its clip about as much;
through the broker and the result store every byte costs about three in Redis writes (base64 JSON, then
Celery's Redis backend both stores and publishes each state). So above ``ANIMEGAMER_INLINE_MAX_BYTES``
they are written here and the message carries a ``BlobRef``, their sha256 and size, instead.

- Blobs are named by their content's hash: writing one twice is harmless, and the bot writing a past
  turn's representation that a worker already wrote costs a touch, not a copy.
- A write goes to a temporary file renamed into place, so a reader never sees half a blob.
- A read checks size and hash; a missing or damaged blob is a ``BlobError`` naming the file and what
  was expected (a damaged one is removed, so the next write makes it again).
- Reading never deletes: a result may be read twice (a bot restarted between reading and recording
  it). ``delete_older_than`` is the retention; a blob written or rewritten counts as new.

In embedded mode the folder is ``<data dir>/blobs``; at scale any path the bot and every worker mount.
Nothing here imports torch: the bot uses it too. Every call is blocking file work; the bot runs it in a thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

from animegamer.settings import Settings
from game.contract import Blob, BlobRef, TurnRequest, TurnResult

log = logging.getLogger(__name__)


class BlobError(RuntimeError):
    """A referenced blob is missing or is not the bytes its reference names; the message names the file."""


class BlobStore:
    def __init__(self, root: Path, inline_max: int) -> None:
        self.root = Path(root)
        self.inline_max = inline_max

    def path_for(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256  # a folder per first byte keeps directories small

    # -- bytes -------------------------------------------------------------------------------------

    def put(self, data: bytes) -> BlobRef:
        """Keep ``data`` (once) and return its reference."""
        ref = BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        path = self.path_for(ref.sha256)
        try:
            if path.stat().st_size == ref.size:
                os.utime(path)  # in use again: its retention age starts over
                return ref
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{ref.sha256}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with tmp.open("wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())  # a reference is only handed out for bytes that are on disk
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return ref

    def get(self, ref: BlobRef) -> bytes:
        """The bytes ``ref`` names, checked against its size and hash."""
        path = self.path_for(ref.sha256)
        expected = f"expected {ref.size} B with sha256 {ref.sha256}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobError(
                f"blob {path} is missing ({expected}); the bot and the workers must share "
                f"one blob folder (ANIMEGAMER_BLOB_DIR), and this one is {self.root}"
            ) from None
        except OSError as exc:
            raise BlobError(f"blob {path} cannot be read ({expected}): {exc}") from exc
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != ref.size or digest != ref.sha256:
            path.unlink(missing_ok=True)
            raise BlobError(f"blob {path} is damaged: {len(data)} B with sha256 {digest}, {expected}; removed it")
        return data

    def pack(self, data: Blob) -> Blob:
        """Small bytes as they are, larger ones as a reference (a reference stays one)."""
        if isinstance(data, BlobRef) or len(data) <= self.inline_max:
            return data
        return self.put(data)

    def read(self, blob: Blob) -> bytes:
        return self.get(blob) if isinstance(blob, BlobRef) else blob

    # -- the contract's messages -------------------------------------------------------------------

    def pack_request(self, request: TurnRequest) -> TurnRequest:
        """The request as it crosses the queue: large past representations by reference."""
        history = [t.model_copy(update={"representation": self.pack(t.representation)}) for t in request.history]
        return request.model_copy(update={"history": history})

    def resolve_request(self, request: TurnRequest) -> TurnRequest:
        """The request with every past representation as bytes (``BlobError`` if one cannot be read)."""
        history = [t.model_copy(update={"representation": self.read(t.representation)}) for t in request.history]
        return request.model_copy(update={"history": history})

    def pack_result(self, result: TurnResult) -> TurnResult:
        """The result as it crosses the result store: a large clip and representation by reference."""
        return result.model_copy(
            update={"mp4": self.pack(result.mp4), "representation": self.pack(result.representation)}
        )

    def resolve_result(self, result: TurnResult) -> TurnResult:
        """The result with its clip and representation as bytes (``BlobError`` if one cannot be read)."""
        return result.model_copy(
            update={"mp4": self.read(result.mp4), "representation": self.read(result.representation)}
        )

    # -- retention ---------------------------------------------------------------------------------

    def delete_older_than(self, age: timedelta) -> int:
        """Delete blobs (and temporary files a crashed writer left) not written for ``age``; how many went.

        Keep ``age`` above the longest a reference can wait to be read: a queued turn's pickup
        timeout plus its time limit for requests, and the result store's expiry (a day) for results.
        """
        cutoff = time.time() - age.total_seconds()
        removed = 0
        if not self.root.is_dir():
            return 0
        for folder in self.root.iterdir():
            if not folder.is_dir():
                continue
            for path in folder.iterdir():
                try:
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
                except FileNotFoundError:
                    continue  # another cleaner got there first
        log.info("deleted %d blob(s) older than %s from %s", removed, age, self.root)
        return removed


def store_for(settings: Settings) -> BlobStore:
    assert settings.blob_dir is not None  # Settings fills it in
    return BlobStore(settings.blob_dir, settings.inline_max_bytes)
