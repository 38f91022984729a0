"""The blob store: clips and representations too large for the queue, kept where the bot and every worker reach.

At the published sizes a turn's representation is 868 KB (226 x 1920 float16) and its clip about as much;
through the broker and the result store every byte costs about three in Redis writes (base64 JSON, then
Celery's Redis backend both stores and publishes each state). So above ``ANIMEGAMER_INLINE_MAX_BYTES``
they are stored here, as raw bytes, and the message carries a ``BlobRef``, their sha256 and size, instead.

Two stores, one contract (``store_for`` picks):

- ``RedisBlobStore``, the default wherever the results are in Redis: one key per blob beside the results, raw
  bytes with a TTL. A bot and workers on machines of their own share the Redis URLs and nothing else.
- ``FolderBlobStore``, the embedded default (``<data dir>/blobs``) and the choice of ``ANIMEGAMER_BLOB_DIR``:
  files named by their hash, written through a temporary name, swept by age.

In both, blobs are named by their content's hash, so writing one twice is harmless (it restarts its age); a
read checks size and hash, and a missing, expired or damaged blob is a ``BlobError`` naming the key or file
and what was expected (a damaged one is removed, so the next write makes it again). Reading never deletes:
a result may be read twice (a bot restarted between reading and recording it). The bot drops a recorded
result's blobs (``drop_result``). In Redis each result's blobs live under keys of their own job's (the same
instruction makes the same representation, so two turns' results often hold the same bytes), and requests'
under keys shared by content: dropping one turn's result never takes bytes another turn or request needs.

Nothing here imports torch: the bot uses it too. Every call is blocking I/O; the bot runs it in a thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

from kombu.utils.url import maybe_sanitize_url

from game.contract import RESULT_KEEP_SECONDS, Blob, BlobRef, TurnRequest, TurnResult
from relay.settings import Settings

log = logging.getLogger(__name__)

# Longer than a request's reference waits to be read: a queued turn's pickup timeout plus its time limit.
REQUEST_KEEP = timedelta(days=2)
PREFIX = "animegamer:blob"
_NAME = re.compile(r"[0-9a-f]{64}")
_TEMPORARY = re.compile(r"\.[0-9a-f]{64}\.[0-9a-f]{8}\.tmp")
_FOLDER = re.compile(r"[0-9a-f]{2}")


class BlobError(RuntimeError):
    """A referenced blob is missing or is not the bytes its reference names; the message names where."""


REQUESTS = "q"  # the scope of requests' past representations, shared by content


def result_scope(task_id: str) -> str:
    """The scope of one turn's result: its clip and representation, dropped once the bot records them. Named by
    the task's id, unique to the turn: job ids restart in every game's database, and two games may share a Redis."""
    return f"r:{task_id}"


def _check(data: bytes, ref: BlobRef, where: str) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != ref.size or digest != ref.sha256:
        raise BlobError(
            f"blob {where} is damaged: {len(data)} B with sha256 {digest}, "
            f"expected {ref.size} B with sha256 {ref.sha256}; removed it"
        )


class BlobStore:
    """What both stores share: which bytes go by reference, and the contract's messages packed and resolved."""

    def __init__(self, inline_max: int) -> None:
        self.inline_max = inline_max

    def put(self, data: bytes, scope: str) -> BlobRef:
        """Keep ``data`` (once per scope) and return its reference."""
        raise NotImplementedError

    def get(self, ref: BlobRef, scope: str) -> bytes:
        """The bytes ``ref`` names in ``scope``, checked against its size and hash."""
        raise NotImplementedError

    def drop(self, ref: BlobRef, scope: str) -> None:
        """Forget bytes nobody will read again; a folder keeps them for the age sweep (one file serves every scope)."""

    def delete_older_than(self, age: timedelta) -> int:
        """Delete blobs not written for ``age``; how many went. Redis expires its own."""
        return 0

    def pack(self, data: Blob, scope: str) -> Blob:
        """Small bytes as they are, larger ones as a reference (a reference stays one)."""
        if isinstance(data, BlobRef) or len(data) <= self.inline_max:
            return data
        return self.put(data, scope)

    def read(self, blob: Blob, scope: str) -> bytes:
        return self.get(blob, scope) if isinstance(blob, BlobRef) else blob

    # -- the contract's messages -------------------------------------------------------------------

    def pack_request(self, request: TurnRequest) -> TurnRequest:
        """The request as it crosses the queue: large past representations by reference."""
        history = [
            t.model_copy(update={"representation": self.pack(t.representation, REQUESTS)}) for t in request.history
        ]
        return request.model_copy(update={"history": history})

    def resolve_request(self, request: TurnRequest) -> TurnRequest:
        """The request with every past representation as bytes (``BlobError`` if one cannot be read)."""
        history = [
            t.model_copy(update={"representation": self.read(t.representation, REQUESTS)}) for t in request.history
        ]
        return request.model_copy(update={"history": history})

    def pack_result(self, result: TurnResult, task_id: str | None = None) -> TurnResult:
        """The result as it crosses the result store: a large clip and representation by reference, kept under the
        turn's task id (its job id where none is given: one game alone on its store)."""
        scope = result_scope(task_id or result.job_id)
        return result.model_copy(
            update={"mp4": self.pack(result.mp4, scope), "representation": self.pack(result.representation, scope)}
        )

    def resolve_result(self, result: TurnResult, task_id: str | None = None) -> TurnResult:
        """The result with its clip and representation as bytes (``BlobError`` if one cannot be read)."""
        scope = result_scope(task_id or result.job_id)
        return result.model_copy(
            update={"mp4": self.read(result.mp4, scope), "representation": self.read(result.representation, scope)}
        )

    def drop_result(self, result: TurnResult, task_id: str | None = None) -> None:
        """Forget a recorded result's blobs (the result as it came from the store, references and all)."""
        for blob in (result.mp4, result.representation):
            if isinstance(blob, BlobRef):
                self.drop(blob, result_scope(task_id or result.job_id))


class FolderBlobStore(BlobStore):
    """Files in a folder every process reaches: the embedded default, or ``ANIMEGAMER_BLOB_DIR``."""

    def __init__(self, root: Path, inline_max: int) -> None:
        super().__init__(inline_max)
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256  # a folder per first byte keeps directories small

    def put(self, data: bytes, scope: str = REQUESTS) -> BlobRef:
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

    def get(self, ref: BlobRef, scope: str = REQUESTS) -> bytes:
        path = self.path_for(ref.sha256)
        expected = f"expected {ref.size} B with sha256 {ref.sha256}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobError(
                f"blob {path} is missing ({expected}); the bot and the workers must share one blob folder "
                f"(ANIMEGAMER_BLOB_DIR), or leave it unset with the results in Redis; this one is {self.root}"
            ) from None
        except OSError as exc:
            raise BlobError(f"blob {path} cannot be read ({expected}): {exc}") from exc
        try:
            _check(data, ref, str(path))
        except BlobError:
            path.unlink(missing_ok=True)
            raise
        return data

    def delete_older_than(self, age: timedelta) -> int:
        """Delete this store's blobs, and temporary files a crashed writer left, not written for ``age``.

        Only names this store makes, in the folders it makes: anything else someone put here stays.
        Keep ``age`` above the longest a reference can wait to be read: a queued turn's pickup timeout
        plus its time limit for requests, and the result store's expiry (a day) for results.
        """
        cutoff = time.time() - age.total_seconds()
        removed = 0
        if not self.root.is_dir():
            return 0
        for folder in self.root.iterdir():
            if not (folder.is_dir() and _FOLDER.fullmatch(folder.name)):
                continue
            for path in folder.iterdir():
                if not (_NAME.fullmatch(path.name) or _TEMPORARY.fullmatch(path.name)):
                    continue
                try:
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
                except FileNotFoundError:
                    continue  # another cleaner got there first
        log.info("deleted %d blob(s) older than %s from %s", removed, age, self.root)
        return removed


class RedisBlobStore(BlobStore):
    """Raw bytes in Redis keys with a TTL, beside the results: what machines that share no folder share."""

    def __init__(self, url: str, inline_max: int, timeout: float) -> None:
        import redis

        super().__init__(inline_max)
        self.url = url
        # A longer read timeout than a claim's: a clip is a megabyte, not a flag.
        self._client = redis.Redis.from_url(url, socket_timeout=max(timeout, 10.0), socket_connect_timeout=timeout)

    @staticmethod
    def key_for(sha256: str, scope: str) -> str:
        return f"{PREFIX}:{scope}:{sha256}"

    @staticmethod
    def keep_seconds(scope: str) -> int:
        return int(REQUEST_KEEP.total_seconds()) if scope == REQUESTS else RESULT_KEEP_SECONDS

    def put(self, data: bytes, scope: str) -> BlobRef:
        ref = BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        key, keep = self.key_for(ref.sha256, scope), self.keep_seconds(scope)
        # Written once; a second write of the same bytes restarts its TTL and sends no bytes.
        if not self._client.expire(key, keep):
            self._client.set(key, data, ex=keep)
        return ref

    def get(self, ref: BlobRef, scope: str) -> bytes:
        key = self.key_for(ref.sha256, scope)
        data = self._client.get(key)
        if data is None:
            raise BlobError(
                f"blob {key} is missing or expired (expected {ref.size} B with sha256 {ref.sha256}); "
                f"blobs live {self.keep_seconds(scope)} s in the Redis at {maybe_sanitize_url(self.url)}"
            )
        try:
            _check(data, ref, key)
        except BlobError:
            self._client.delete(key)
            raise
        return data

    def drop(self, ref: BlobRef, scope: str) -> None:
        self._client.delete(self.key_for(ref.sha256, scope))


def store_for(settings: Settings) -> BlobStore:
    """The folder when one is set (the default unless the results are in Redis), else the results' Redis."""
    if settings.blob_dir is not None:
        return FolderBlobStore(settings.blob_dir, settings.inline_max_bytes)
    return RedisBlobStore(settings.result_backend, settings.inline_max_bytes, settings.broker_timeout)
