"""Alembic environment: runs revisions against the game database, async, one connection.

Follows alembic's async template. Three ways in:

- ``db.migrate.upgrade(url)`` (the app's CLI): the URL arrives in ``config.attributes["url"]``;
- a caller that already holds a connection passes it in ``config.attributes["connection"]``;
- the ``alembic`` command line: ``-x url=...`` or ``sqlalchemy.url`` from ``alembic.ini``.

SQLite runs with foreign keys OFF here: batch mode rebuilds a table by copying it and dropping
the old one, and with foreign keys on, that drop would cascade-delete rows in child tables.

An upgrade is one transaction on both databases, so a revision that fails leaves the database as it was:
- SQLite: Python's sqlite3 opens a transaction only before INSERT/UPDATE/DELETE and runs CREATE, ALTER and
  DROP outside any, so a failure half way left the schema half changed (an ``_alembic_tmp_*`` table, a renamed
  column without its index). SQLAlchemy's documented recipe for (aio)sqlite takes over: the driver emits no
  BEGIN of its own, SQLAlchemy emits one as its transaction starts, and DDL is inside it.
- PostgreSQL: its DDL is transactional already; a transaction-scoped advisory lock makes a second process
  that upgrades at the same moment (two bots starting, a migration job beside a bot) wait for the first and
  then find nothing left to do.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import event, pool, text
from sqlalchemy.engine import Connection

import db.models  # noqa: F401  (registers every table on Base.metadata)
from db.base import Base, UtcDateTime
from db.engine import make_engine

config = context.config

if config.config_file_name is not None and not config.attributes.get("skip_logging_config"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata

MIGRATION_LOCK = 0x616E696D  # "anim": the advisory lock key every upgrading process takes on PostgreSQL


def _url() -> str:
    url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: use db.migrate.upgrade(url) or `alembic -x url=... upgrade head`")
    return str(url)


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    """Render our column types as plain SQLAlchemy ones, so revisions never import app code."""
    if type_ == "type" and isinstance(obj, UtcDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=True,  # SQLite alters tables by copy-and-swap; harmless elsewhere
        render_item=_render_item,
        **kwargs,
    )


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it (``alembic upgrade head --sql``)."""
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    # SQLite's DDL is transactional too once the driver no longer decides where transactions begin (above).
    _configure(connection=connection, transactional_ddl=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        context.run_migrations()


def _sqlite_transactions_by_sqlalchemy(engine: Any) -> None:
    """SQLAlchemy's recipe for (aio)sqlite: the driver emits no BEGIN, SQLAlchemy emits it as a transaction starts."""

    @event.listens_for(engine.sync_engine, "connect")
    def no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine.sync_engine, "begin")
    def begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN")


async def run_async_migrations() -> None:
    # NullPool: this engine lives for one asyncio.run() and must not keep connections around.
    engine = make_engine(_url(), foreign_keys=False, poolclass=pool.NullPool)
    if engine.dialect.name == "sqlite":
        _sqlite_transactions_by_sqlalchemy(engine)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        do_run_migrations(connection)
    else:
        asyncio.run(run_async_migrations())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
