"""Where the bot keeps finished clips and kept recaps: by key, behind one interface; callers never see a path.

A row keeps the key (``<game>/<guild>/job_<id>.mp4``), never a path: a bot started from another working directory,
or moved to another machine with its data, still finds every clip (revision 0007 turned the paths stored before into
keys). Every key the bot makes starts with its game's id (``game``, kept in the database: revision 0011), so games
sharing a bucket, whose job and story ids all start at 1, never touch each other's objects; keys stored before
carry none and are read as written. Only the bot reads clips; the workers send theirs through the blob store.

Callers ask for bytes (``get``, ``put``) or, to join clips into a recap, for a local copy (``copy_to``) and store a
finished file (``put_file``): nothing outside this module assumes the clips lie in a folder, so the store can be
one that several machines reach. The embedded default is a folder (``ANIMEGAMER_CLIP_DIR``), which bot processes of
one game share. Every method blocks: call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from relay.settings import Settings
from relay.tls import certificate_problem

log = logging.getLogger(__name__)
_COUNTING = threading.Lock()


class ClipStore(ABC):
    # Operations the store refused or failed ("put", "get", ...) since the process started, counted where they
    # fail: the bot's metrics export them (animegamer_clip_store_failures_total), and an alert pages on a rise.
    failures: Counter[str]
    game = ""  # this game's id, set from the database as the bot starts (db.queries.game_id); every new key's start

    def _failed(self, operation: str) -> None:
        """Counted from the threads the calls run in: one lock, so two failing at once both count."""
        with _COUNTING:
            self.failures[operation] += 1

    @classmethod
    def of(cls, settings: Settings) -> ClipStore:
        """The store the settings name: ``ANIMEGAMER_CLIP_STORE=s3://bucket/prefix``, else the clip folder."""
        if settings.clip_store.startswith("s3://"):
            return S3Store.connect(settings)
        return FolderStore(settings.clip_dir or settings.data_dir / "clips")

    @property
    @abstractmethod
    def where(self) -> str:
        """The store in words, for logs and `animegamer check`: never a secret."""

    def key(self, guild_id: int | None, job_id: int) -> str:
        """Where a finished turn's clip goes: under this game's id, then the server's."""
        return f"{self.game}/{guild_id}/job_{job_id}.mp4" if self.game else f"{guild_id}/job_{job_id}.mp4"

    def ready(self) -> None:  # noqa: B027 - a folder is made by its first write: nothing to ask
        """Raise StoreUnavailable, saying what, when the store's home is missing or refuses us."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, whole or not at all (a refused write, a full disk, leaves nothing)."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Store a local file under ``key``, whole or not at all, without reading it into memory."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The bytes under ``key``; FileNotFoundError when there are none."""

    @abstractmethod
    def copy_to(self, key: str, path: Path) -> None:
        """A local copy of ``key`` at ``path`` (to join clips); FileNotFoundError when there is none."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``."""

    def delete(self, keys: Iterable[str]) -> list[str]:
        """Delete each key; returns the keys that were already gone. What the store could not delete is logged: a
        caller whose row no longer names the key records the deletion first (bot/clip_deletes.py)."""
        missing, failed = self.delete_now(keys)
        for key in failed:
            log.warning("clip %s not deleted (the store did not answer)", key)
        return missing

    @abstractmethod
    def delete_now(self, keys: Iterable[str]) -> tuple[list[str], list[str]]:
        """Delete each key; returns the keys that were already gone (a store that cannot tell returns none) and the
        keys it could not delete now (a store that is down, a file it may not remove)."""


class StoreUnavailable(OSError):
    """The store did not answer, or refused us (credentials, bucket): a clip to write or read waits and is tried
    again, never lost and never posted without its clip. The message names the store, never a secret."""


class StoreCertificateRefused(StoreUnavailable):
    """The store answers over TLS with a certificate this process does not trust (another CA, expired): what to fix
    is the CA bundle or the certificate, not the store's address."""


FLEET_MARKS = ".fleet"  # where each bot process of a game leaves its mark in a clip folder


class UnsharedClips(Exception):
    """Bot processes of one game keep their clips in folders that are not one: a turn whose result one applied and
    the other posts would go out without its clip. Raised at start, with the one line that says what to set."""


class FolderStore(ClipStore):
    """Clips as files under one folder, each at its key.

    Every bot process of a game must see one folder (a volume they all mount), since any of them may apply a result
    and another post it. Each leaves a mark in it (``.fleet/<its name>``), and one that starts beside a live process
    whose mark it cannot see refuses to start (bot/app.py).
    """

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()  # fixed at start: a later change of working directory moves nothing
        self.failures = Counter()

    @property
    def where(self) -> str:
        return str(self.root)

    def mark(self, process: str) -> None:
        """Leave this process's mark in the folder, for the others to find; a folder that refuses it (full, read
        only, not a folder) refuses clips too, which the store's own errors say, turn by turn."""
        try:
            (self.root / FLEET_MARKS).mkdir(parents=True, exist_ok=True)
            (self.root / FLEET_MARKS / process).touch()
        except OSError as exc:
            log.warning("clip folder %s: this process's mark not left (%s)", self.root, exc)

    def unmark(self, process: str) -> None:
        with contextlib.suppress(OSError):
            (self.root / FLEET_MARKS / process).unlink()

    def apart(self, live: set[str]) -> set[str]:
        """The live bot processes of this game that left no mark here: they keep their clips in another folder."""
        return {process for process in live if not (self.root / FLEET_MARKS / process).exists()}

    def refuse(self, apart: set[str]) -> UnsharedClips:
        """What a process says, and ends with, when ``apart`` keep their clips elsewhere."""
        return UnsharedClips(
            f"ANIMEGAMER_CLIP_STORE is not set and this bot's clip folder {self.root} is not the folder of the bot "
            f"process {min(apart)} already running on this database, so a turn one of them makes would be posted "
            "by the other without its clip: set ANIMEGAMER_CLIP_STORE=s3://bucket/prefix for every bot process, "
            "or give them all one folder (ANIMEGAMER_CLIP_DIR on a shared volume)."
        )

    def path(self, key: str) -> Path:
        """The key's file. A row older than keys that revision 0007 could not read as one keeps its absolute
        path, which this returns unchanged."""
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        self._into_place(key, lambda tmp: tmp.write_bytes(data))

    def put_file(self, key: str, path: Path) -> None:
        self._into_place(key, lambda tmp: shutil.copyfile(path, tmp))

    def _into_place(self, key: str, write) -> None:
        final = self.path(key)
        tmp = final.with_name(f".{final.name}.{secrets.token_hex(4)}.partial")  # two writers never share one
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            write(tmp)
            tmp.replace(final)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):  # a full disk, a folder that refuses us
                self._failed("put")
            raise

    def get(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def copy_to(self, key: str, path: Path) -> None:
        source = self.path(key)
        try:
            os.link(source, path)  # the same disk: no bytes copied
        except OSError:
            if not source.is_file():
                raise FileNotFoundError(f"no clip at {key}") from None
            shutil.copyfile(source, path)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def keys(self, prefix: str) -> list[str]:
        folder, _, start = prefix.rpartition("/")
        where = self.root / folder
        if not where.is_dir():
            return []
        found = [p.name for p in where.iterdir() if p.is_file() and p.name.startswith(start)]
        return sorted(f"{folder}/{name}" if folder else name for name in found if not name.startswith("."))

    def delete_now(self, keys: Iterable[str]) -> tuple[list[str], list[str]]:
        missing, failed = [], []
        for key in keys:
            try:
                self.path(key).unlink()
            except FileNotFoundError:
                missing.append(key)
            except OSError as exc:
                log.warning("clip %s not deleted (%s)", key, exc)
                failed.append(key)
        return missing, failed


class S3Store(ClipStore):
    """Clips as objects in an S3-compatible store (AWS S3, SeaweedFS, MinIO, R2, ...), under ``s3://bucket/prefix``.

    Through boto3: AWS's own client, kept in step with the S3 API, whose ``put_object`` lands an object whole or not
    at all and whose transfer manager streams a large file in parts, so a recap never sits in memory. Every call has
    time limits (a quarter of the bot's duty hold to connect, and as long between two reads: 2.5 s by default) and
    one retry, so a store that holds a call ends it within half the hold of the duty that made it; what still fails is a
    StoreUnavailable, which the callers treat as a store that is down, and an object that is not there is a
    FileNotFoundError, as from the folder.
    """

    def __init__(self, client: Any, bucket: str, prefix: str, endpoint: str) -> None:
        self.client, self.bucket, self.prefix, self.endpoint = client, bucket, prefix, endpoint
        self.failures = Counter()

    @classmethod
    def connect(cls, settings: Settings) -> S3Store:
        import boto3
        from botocore.config import Config

        bucket, _, prefix = settings.clip_store.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"ANIMEGAMER_CLIP_STORE={settings.clip_store!r} names no bucket: s3://bucket/prefix")
        limit = settings.duty_seconds / 4
        config = Config(
            connect_timeout=limit,
            read_timeout=limit,
            retries={"max_attempts": 2, "mode": "standard"},
            s3={"addressing_style": "path"},  # what self-hosted stores answer; AWS takes it too
        )
        secret = settings.aws_secret_access_key
        client = boto3.client(
            "s3",
            endpoint_url=settings.aws_endpoint_url or None,
            region_name=settings.aws_default_region,
            aws_access_key_id=settings.aws_access_key_id or None,
            aws_secret_access_key=secret.get_secret_value() if secret is not None else None,
            config=config,
            verify=str(settings.aws_ca_bundle) if settings.aws_ca_bundle is not None else None,  # None: verified
        )
        prefix = prefix.strip("/")
        return cls(client, bucket, f"{prefix}/" if prefix else "", settings.aws_endpoint_url or "AWS")

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} at {self.endpoint}"

    def _call(self, what: str, key: str, call: Callable[[], Any]) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call()
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"no object {key} in {self.where}") from None
            self._failed(what)
            raise StoreUnavailable(f"{what} {key} in {self.where} refused: {code or exc}") from None
        except (BotoCoreError, OSError) as exc:
            self._failed(what)
            if (problem := certificate_problem(exc)) is not None:  # it answers, with a certificate not trusted
                raise StoreCertificateRefused(f"{what} {key} in {self.where} was refused: {problem.said}") from None
            raise StoreUnavailable(f"{what} {key} in {self.where} failed: {type(exc).__name__}") from None

    def ready(self) -> None:
        """Some stores (SeaweedFS) make a missing bucket on the first write: asked first, so a typo is named."""
        try:
            self._call("look for", "the bucket", lambda: self.client.head_bucket(Bucket=self.bucket))
        except FileNotFoundError:
            raise StoreUnavailable(f"the bucket {self.bucket} does not exist at {self.endpoint}") from None

    def put(self, key: str, data: bytes) -> None:
        self._call("put", key, lambda: self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data))

    def put_file(self, key: str, path: Path) -> None:
        self._call("put", key, lambda: self.client.upload_file(str(path), self.bucket, self.prefix + key))

    def get(self, key: str) -> bytes:
        answer = self._call("get", key, lambda: self.client.get_object(Bucket=self.bucket, Key=self.prefix + key))
        return self._call("get", key, answer["Body"].read)

    def copy_to(self, key: str, path: Path) -> None:
        self._call("get", key, lambda: self.client.download_file(self.bucket, self.prefix + key, str(path)))

    def exists(self, key: str) -> bool:
        try:
            self._call("look for", key, lambda: self.client.head_object(Bucket=self.bucket, Key=self.prefix + key))
        except FileNotFoundError:
            return False
        return True

    def keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + prefix)
        found = self._call("list", prefix, lambda: [item["Key"] for page in pages for item in page.get("Contents", [])])
        return sorted(key.removeprefix(self.prefix) for key in found)

    def delete_now(self, keys: Iterable[str]) -> tuple[list[str], list[str]]:
        wanted, failed = list(keys), []
        for start in range(0, len(wanted), 1000):  # S3 deletes at most 1,000 objects a request
            chunk = wanted[start : start + 1000]
            batch = [{"Key": self.prefix + key} for key in chunk]
            try:
                answer = self._call(
                    "delete",
                    f"{len(batch)} objects",
                    lambda b=batch: self.client.delete_objects(
                        Bucket=self.bucket, Delete={"Objects": b, "Quiet": True}
                    ),
                )
            except StoreUnavailable as exc:
                log.warning("%s", exc)
                failed += chunk
                continue
            for error in answer.get("Errors", []):
                log.warning("clip %s not deleted (%s)", error.get("Key"), error.get("Code"))
                failed.append(str(error.get("Key", "")).removeprefix(self.prefix))
        # S3 deletes a missing object as happily as a present one: it cannot tell which were gone.
        return [], failed
