"""`animegamer check`: does this configuration work, from where it runs, before a player waits on it?

Each check tries the real thing (connects, writes and reads back, asks the workers) and says what to do when it
fails. A bot's machine checks everything; a worker's (``role="worker"``) only what a worker needs. Nothing here
prints a secret: URLs are shown with their password masked, the Discord token only as "set" and its shape.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal
from urllib.parse import urlsplit

from kombu.utils.url import maybe_sanitize_url

from relay.settings import Settings
from relay.tls import certificate_problem, postgres_transport, public_host, redis_transport

Status = Literal["ok", "warn", "fail"]
Role = Literal["bot", "worker"]
LOW_DISK_BYTES = 1 << 30  # under this free under the data folder, a warning: a day of clips at published sizes
NO_DISK_BYTES = 100 << 20  # under this, a failure: the next clips cannot be stored


@dataclass(frozen=True)
class Result:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def run_checks(settings: Settings, role: Role = "bot") -> list[Result]:
    shared: list[Callable[[Settings], Result]] = [queue, blob_store, disk]
    checks = [database, discord_token, *shared, clip_store, workers] if role == "bot" else [*shared, nudity_detector]
    results = [_guarded(check, settings) for check in checks]
    return results + redis_settings(settings)


def _guarded(check: Callable[[Settings], Result], settings: Settings) -> Result:
    try:
        return check(settings)
    except Exception as exc:  # a check that breaks is a failed check, never a traceback
        return Result(check.__name__.replace("_", " "), "fail", f"{type(exc).__name__}: {exc}")


def database(settings: Settings) -> Result:
    from db.engine import sqlite_path
    from db.migrate import current_revision, head_revision

    name, shown = "database", maybe_sanitize_url(settings.database_url)
    upgrade = "animegamer db upgrade (the bot also does it as it starts)"
    file = sqlite_path(settings.database_url)
    if file is not None and not file.exists():  # looking must not create it
        return Result(name, "fail", f"there is no database at {file} yet", upgrade)
    try:
        revision = asyncio.run(current_revision(settings.database_url))
    except Exception as exc:
        if (problem := certificate_problem(exc)) is not None:
            fix = "set ANIMEGAMER_DATABASE_CA_FILE to the CA that signed the server's certificate, or renew it"
            return Result(name, "fail", f"{shown.split('?')[0]} was refused: {problem.said}", fix)
        return Result(name, "fail", f"{shown} does not answer ({type(exc).__name__})", "check ANIMEGAMER_DATABASE_URL")
    head = head_revision()
    if revision != head:
        return Result(name, "fail", f"{shown} is at revision {revision}, the code needs {head}", upgrade)
    if settings.database_url.startswith("postgresql"):
        shown = f"{shown.split('?')[0]} ({postgres_transport(settings.database_url).said()})"
    return Result(name, "ok", f"{shown} at revision {head}")


def discord_token(settings: Settings) -> Result:
    name = "discord token"
    if settings.discord_token is None or not settings.discord_token.get_secret_value().strip():
        return Result(name, "fail", "DISCORD_TOKEN is not set", "copy the bot's token from the Developer Portal")
    parts = settings.discord_token.get_secret_value().strip().split(".")
    if len(parts) != 3 or not all(parts) or not _is_id(parts[0]):
        fix = "copy the Bot token (three parts joined by dots), not the client secret or the public key"
        return Result(name, "fail", "DISCORD_TOKEN is set but is not shaped like a bot token", fix)
    return Result(name, "ok", "set, shaped like a bot token (not shown)")


def _is_id(part: str) -> bool:
    """A bot token starts with the bot's user id, base64-encoded."""
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode().isdigit()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False


def queue(settings: Settings) -> Result:
    from relay.celery_app import BrokerUnavailable, check_broker, make_celery

    shown = f"broker {_where(settings.broker_url)}, results {_where(settings.result_backend)}"
    try:
        check_broker(make_celery(settings), settings.broker_timeout)
    except BrokerUnavailable as exc:
        if (problem := certificate_problem(exc.__cause__ or exc)) is not None:
            shown = maybe_sanitize_url(settings.broker_url).split("?")[0]
            return Result("queue", "fail", f"{shown} was refused: {problem.said}", problem.fix)
        return Result("queue", "fail", str(exc).split(" (")[0], "start it, or fix ANIMEGAMER_BROKER_URL")
    return _in_the_clear("queue", shown, settings.broker_url, settings.result_backend)


def _where(url: str) -> str:
    """A server's URL without its password or query, and how the connection travels (relay/tls.py)."""
    transport = redis_transport(url) if url.startswith(("redis://", "rediss://")) else None
    shown = maybe_sanitize_url(url).split("?")[0]
    return f"{shown} ({transport.said()})" if transport is not None else shown


def _in_the_clear(name: str, detail: str, *urls: str) -> Result:
    """Ok, or a warning where a connection to a public address travels in plain text: every turn and the password
    then cross networks nobody here owns as they are."""
    exposed = [u for u in urls if u.startswith("redis://") and public_host(u)]
    if exposed:
        fix = "use rediss:// with ANIMEGAMER_REDIS_CA_FILE (docs/operating.md, a worker on a network you don't own)"
        return Result(name, "warn", f"{detail}; plain text to a public address", fix)
    return Result(name, "ok", detail)


def nudity_detector(settings: Settings) -> Result:
    """The detector every clip passes before it leaves this worker: without it, every clip is withheld."""
    name, fix = "nudity detector", "pip install '.[worker]' (nudenet, onnxruntime); until then every clip is withheld"
    try:
        import numpy as np

        from worker.safety import DetectorUnavailable, NudeNetChecker
    except ImportError as exc:
        return Result(name, "fail", f"the worker's libraries are not installed ({exc.name} is missing)", fix)
    try:
        checker = NudeNetChecker.load(threads=1)
    except DetectorUnavailable as exc:
        return Result(name, "fail", str(exc), fix)
    report = checker(np.zeros((1, 64, 64, 3), np.uint8))
    if not report.checked:
        return Result(name, "fail", f"{checker.name} loads but fails on a blank frame: {report.error}", fix)
    return Result(name, "ok", f"{checker.name} loads and checked a frame in {1000 * report.seconds:.0f} ms")


def clip_store(settings: Settings) -> Result:
    """Where the bot keeps clips: one object written, read back and deleted, as a posted turn would."""
    from bot.clip_store import ClipStore, StoreCertificateRefused

    store = ClipStore.of(settings)
    probe, key = os.urandom(16), f".check-{os.getpid()}"
    try:
        store.ready()
        store.put(key, probe)
        back = store.get(key)
        store.delete([key])
    except OSError as exc:
        fix = "create the bucket, or fix AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        if not settings.clip_store:
            fix = "make the clip folder writable by this user (ANIMEGAMER_CLIP_DIR)"
        elif isinstance(exc, StoreCertificateRefused):
            fix = "set AWS_CA_BUNDLE to the CA that signed the store's certificate, or renew it"
        return Result("clip store", "fail", f"cannot write and read {store.where} ({exc})", fix)
    if back != probe:
        return Result("clip store", "fail", f"{store.where} gave back other bytes than were written")
    if not settings.clip_store:
        return Result("clip store", "ok", f"{store.where}: written, read back and deleted")
    endpoint = settings.aws_endpoint_url or "https://s3.amazonaws.com"
    transport = "TLS, certificate verified" if endpoint.startswith("https://") else "plain text"
    return Result("clip store", "ok", f"{store.where} ({transport}): written, read back and deleted")


def blob_store(settings: Settings) -> Result:
    from relay.blob_store import REQUESTS, store_for

    where = (
        str(settings.blob_dir)
        if settings.blob_dir is not None
        else f"Redis at {maybe_sanitize_url(settings.result_backend)}"
    )
    probe = os.urandom(32)
    try:
        store = store_for(settings)
        back = store.get(store.put(probe, REQUESTS), REQUESTS)
    except Exception as exc:
        fix = "make the folder writable by this user, or unset ANIMEGAMER_BLOB_DIR to keep blobs in Redis"
        return Result("blob store", "fail", f"cannot write and read {where} ({type(exc).__name__}: {exc})", fix)
    if back != probe:
        return Result("blob store", "fail", f"{where} gave back other bytes than were written")
    return Result("blob store", "ok", f"{where}: written and read back")


def workers(settings: Settings) -> Result:
    from relay.celery_app import served_queues
    from relay.control import control_for

    presences = control_for(settings.result_backend, settings.broker_timeout).workers()
    missing, other_model = [], []
    for name in served_queues(settings):
        serving = [p for p in presences if name in p.queues]
        if not serving:
            missing.append(name)
        elif all(p.model not in (None, settings.model) for p in serving):
            other_model.append(f"{name} ({', '.join(sorted({str(p.model) for p in serving}))})")
    if missing:
        fix = "start `animegamer worker` with the same broker, result store, queue and model settings"
        return Result("workers", "fail", f"no worker answers for queue {', '.join(missing)}", fix)
    if other_model:
        fix = f"run the workers with ANIMEGAMER_MODEL={settings.model}, or set the bot's to theirs"
        return Result("workers", "fail", f"workers on {', '.join(other_model)} run another model", fix)
    return Result("workers", "ok", f"{len(presences)} answering, every queue served, model {settings.model}")


def disk(settings: Settings) -> Result:
    folder = settings.data_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the data folder is made at start: measure where it will be
    free = shutil.disk_usage(folder).free
    detail = f"{free / 2**30:.1f} GiB free under {settings.data_dir}"
    if free < NO_DISK_BYTES:
        return Result("disk", "fail", detail, "free space there, or point ANIMEGAMER_DATA_DIR at a larger disk")
    if free < LOW_DISK_BYTES:
        return Result("disk", "warn", detail, "clips and the database grow with every turn: free some space")
    return Result("disk", "ok", detail)


def redis_settings(settings: Settings) -> list[Result]:
    """Warnings only: a Redis that forgets on restart or evicts under memory costs turns made twice, not lost."""
    servers: dict[str, str] = {}  # one check per server, whichever of its databases each URL names
    for url in (settings.broker_url, settings.result_backend):
        if url.startswith(("redis://", "rediss://")):
            servers.setdefault(urlsplit(url).netloc, url)
    return [_redis(url) for url in servers.values()]


def _redis(url: str) -> Result:
    import redis

    name = f"redis {_where(url)}"
    try:
        config = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5).config_get("*")
    except redis.ResponseError:  # managed Redis services often refuse CONFIG
        return Result(name, "warn", "its settings cannot be read (CONFIG is refused)", "check them with your provider")
    except redis.RedisError as exc:
        if (problem := certificate_problem(exc)) is not None:
            return Result(name, "fail", f"refused: {problem.said}", problem.fix)
        return Result(name, "fail", f"does not answer ({type(exc).__name__})", "start it, or fix the URL")
    problems = []
    if config.get("appendonly") != "yes" and not config.get("save"):
        problems.append("no persistence: a restart makes every turn in flight again (appendonly yes)")
    if config.get("maxmemory-policy", "noeviction") != "noeviction":
        problems.append(f"maxmemory-policy {config['maxmemory-policy']} may evict a turn's result (noeviction)")
    if problems:
        return Result(name, "warn", "; ".join(problems), "docs/operating.md")
    return Result(name, "ok", "persistent, evicts nothing")
