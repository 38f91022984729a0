"""Engine and session factory: one of each per process (and per event loop).

For SQLite every new connection is set up the same way: WAL so the supervisor can read while
a command writes, ``foreign_keys=ON`` because SQLite ignores foreign keys unless asked on each
connection, and a busy timeout so a write waits a bounded time for another writer. A path that
cannot hold a database (a directory, a place we may not write, a file that is not SQLite) is
reported as :class:`DatabaseFileError` naming the path at the first connect, instead of a
driver traceback that does not say which file.
"""

from __future__ import annotations

import logging
import sqlite3
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

log = logging.getLogger(__name__)

DEFAULT_URL = "sqlite+aiosqlite:///data/animegamer.db"

# SQLite result codes that mean "this path is not a usable database", as opposed to a bad query.
_FILE_ERRORS = frozenset(
    {"SQLITE_CANTOPEN", "SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_READONLY", "SQLITE_PERM", "SQLITE_IOERR"}
)
_FILE_ERROR_PREFIXES = tuple(f"{code}_" for code in _FILE_ERRORS)  # e.g. SQLITE_IOERR_WRITE


class DatabaseFileError(RuntimeError):
    """The database path cannot be used; the message names it and says what to check."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)  # args carry both, so the exception pickles
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return (
            f"cannot use {self.path!r} as the game database: {self.reason}. "
            "Point ANIMEGAMER_DATABASE_URL at a writable SQLite file (it is created if missing), "
            "or move the broken file aside."
        )


def sqlite_path(url: str | URL) -> Path | None:
    """The file behind a SQLite URL; None for other backends and for in-memory databases."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or parsed.query.get("mode") == "memory":
        return None
    return Path(database)


def _is_file_error(exc: BaseException) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return name in _FILE_ERRORS or name.startswith(_FILE_ERROR_PREFIXES)


def _install_sqlite_hooks(engine: AsyncEngine, path: Path | None, foreign_keys: bool, busy_timeout: float) -> None:
    shown = str(path) if path is not None else (engine.url.database or ":memory:")

    @event.listens_for(engine.sync_engine, "do_connect")
    def _check_path(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> None:
        # Runs before the driver opens the file: create the folder and refuse a directory, so the
        # driver's vague "unable to open database file" is only left for the odd case.
        if path is None:
            return
        if path.is_dir():
            raise DatabaseFileError(shown, "it is a directory")
        if path.parent.exists() and not path.parent.is_dir():
            raise DatabaseFileError(shown, f"its folder {str(path.parent)!r} is a file")
        if path.parent.is_dir():
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseFileError(shown, f"cannot create its folder ({exc.strerror or exc})") from exc
        log.info("created the database folder %s", path.parent)

    @event.listens_for(engine.sync_engine, "connect")
    def _set_pragmas(dbapi_connection: Any, connection_record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            # The first statement reads the header, so this is where a non-database file shows.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
            # A write that finds another writer waits this long, then fails ("database is locked"),
            # which commands answer as "busy, try again" (they answered Discord before writing).
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        except sqlite3.Error as exc:
            # The pool does not close a connection whose connect hook failed; an open aiosqlite
            # connection keeps its worker thread (and the file handle) alive, so close it here.
            cursor.close()
            dbapi_connection.close()
            if _is_file_error(exc):
                raise DatabaseFileError(shown, str(exc)) from exc
            raise
        cursor.close()

    @event.listens_for(engine.sync_engine, "handle_error")
    def _name_the_file(context: Any) -> None:
        # Opening failures (permissions, a vanished folder) and file errors found later (a file
        # made read-only, a disk error, corruption past the header) come through here; ordinary
        # statement errors (constraints, syntax) pass unchanged.
        original = context.original_exception
        if _is_file_error(original):
            raise DatabaseFileError(shown, str(original)) from original


TLS_KEYS = ("sslmode", "ssl", "sslrootcert", "sslcert", "sslkey")


def postgres_tls(url: URL) -> tuple[URL, ssl.SSLContext | str | None]:
    """libpq's TLS words in a database URL (``sslmode=verify-full&sslrootcert=ca.pem``, and ``sslcert``/``sslkey`` for
    a client certificate) as the ``ssl`` argument asyncpg takes, and the URL without them. SQLAlchemy hands the query
    to asyncpg as keyword arguments, and asyncpg takes no ``sslrootcert``: the CA file would be refused, or with
    ``ssl=verify-full`` alone looked for in ~/.postgresql. verify-full checks the certificate and the host name,
    verify-ca the certificate only; any other mode (require, prefer, disable) is passed on as it is."""
    query = url.query
    if not any(key in query for key in TLS_KEYS):
        return url, None
    mode = str(query.get("sslmode") or query.get("ssl") or "prefer")
    stripped = url.difference_update_query(TLS_KEYS)
    if mode not in ("verify-ca", "verify-full"):
        return stripped, mode
    context = ssl.create_default_context(cafile=str(query["sslrootcert"]) if "sslrootcert" in query else None)
    context.check_hostname = mode == "verify-full"
    if "sslcert" in query:
        context.load_cert_chain(str(query["sslcert"]), str(query["sslkey"]) if "sslkey" in query else None)
    return stripped, context


def make_engine(
    url: str | URL = DEFAULT_URL,
    *,
    foreign_keys: bool = True,
    busy_timeout: float = 5.0,
    call_timeout: float | None = None,
    **kwargs: Any,
) -> AsyncEngine:
    """An AsyncEngine for ``url``; for SQLite with WAL and (unless told not to) foreign keys on.

    ``foreign_keys=False`` exists for migrations: SQLite batch mode drops and recreates tables,
    and with foreign keys on, dropping a parent table would cascade-delete its children's rows.
    ``call_timeout`` bounds every PostgreSQL call (connecting, a statement, waiting for a pooled connection), so
    that a duty's round never waits on the database longer than its hold lasts: the bot passes half its duty hold.
    Extra keyword arguments go to :func:`create_async_engine` (e.g. ``poolclass=NullPool``).
    """
    if make_url(url).get_backend_name() == "postgresql":
        url, tls = postgres_tls(make_url(url))
        if tls is not None:
            kwargs["connect_args"] = {**kwargs.get("connect_args", {}), "ssl": tls}
    if call_timeout is not None and make_url(url).get_backend_name() == "postgresql":
        kwargs.setdefault("pool_timeout", call_timeout)
        kwargs["connect_args"] = {
            "timeout": call_timeout,  # asyncpg: to connect
            "command_timeout": call_timeout,  # asyncpg: each statement, seen from here (a network that holds bytes)
            "server_settings": {"statement_timeout": str(int(call_timeout * 1000))},  # and by the server
            **kwargs.get("connect_args", {}),
        }
    engine = create_async_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        _install_sqlite_hooks(engine, sqlite_path(url), foreign_keys, busy_timeout)
    return engine


# What a duty is handed to reach the database: anything that opens a session (a sessionmaker, or a bot's method
# that opens one of the sessionmaker it makes at start).
Sessions = Callable[[], AsyncSession]


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """The session factory; objects stay readable after commit, so no lazy refresh under asyncio."""
    return async_sessionmaker(engine, expire_on_commit=False)
