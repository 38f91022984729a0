"""Schema migrations, run programmatically: the CLI and tests upgrade a database by URL.

The schema only ever changes through a revision in ``migrations/versions``. These functions
build an Alembic config in code (no ``alembic.ini`` needed) that points at the installed
``migrations`` package, so they work from any working directory and from an installed wheel.

They are synchronous: Alembic's ``env.py`` runs its own ``asyncio.run()`` with a NullPool
engine, which needs a thread with no running event loop. From async code use the ``*_async``
variants, which run the same work in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import NullPool
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

import migrations
from db.engine import make_engine

log = logging.getLogger(__name__)


def _migrations_dir() -> Path:
    # ``__path__`` rather than ``__file__``: an editable install made before the package had an
    # ``__init__.py`` imports it as a namespace package, whose ``__file__`` is None.
    for entry in migrations.__path__:
        if (Path(entry) / "env.py").is_file():
            return Path(entry).resolve()
    raise RuntimeError(f"no env.py in the migrations package ({list(migrations.__path__)}); is the install complete?")


MIGRATIONS_DIR = _migrations_dir()


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` that needs no ini file."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolates '%', which URL-encoded passwords contain; attributes do not.
    config.attributes["url"] = url
    return config


def _refuse_running_loop(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"db.migrate.{name}() was called inside a running event loop; await {name}_async() instead")


class DatabaseRefused(RuntimeError):
    """The server answers but refuses the URL's user or database: said in one line, with what to do."""


class DatabaseMissing(DatabaseRefused):
    """The server answers but has no database of that name: it must be created before it is migrated."""


@contextlib.contextmanager
def _database_named(url: str) -> Iterator[None]:
    """A server database that does not exist (SQLSTATE 3D000: invalid catalog name) or a login the server refuses
    (class 28) is said in one line, with what to do, not as asyncpg's traceback. By the code, not the words: a missing
    role or relation "does not exist" too, and is not a database to create."""
    try:
        yield
    except DBAPIError as exc:
        code = str(getattr(exc.orig, "sqlstate", None) or "")
        where = make_url(url)
        server = f"{where.host}:{where.port or 5432}" if where.host else "the local server"
        if code.startswith("28"):
            raise DatabaseRefused(
                f"PostgreSQL on {server} refused the login ({exc.orig}): check the user and password of "
                "ANIMEGAMER_DATABASE_URL."
            ) from None
        if code != "3D000":
            raise
        host = f"-h {where.host} " if where.host else ""
        raise DatabaseMissing(
            f'The database "{where.database}" does not exist on {server}: create it '
            f"(createdb {host}-U {where.username} {where.database}, or CREATE DATABASE {where.database} "
            "as a user that may), then run `animegamer db upgrade` again."
        ) from None


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` up to ``revision`` (creating the SQLite file if needed)."""
    _refuse_running_loop("upgrade")
    log.info("upgrading database schema to %s", revision)
    with _database_named(url):
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Take the database at ``url`` down to ``revision`` (``"base"`` drops every table)."""
    _refuse_running_loop("downgrade")
    log.info("downgrading database schema to %s", revision)
    with _database_named(url):
        command.downgrade(alembic_config(url), revision)


async def upgrade_async(url: str, revision: str = "head") -> None:
    await asyncio.to_thread(upgrade, url, revision)


async def downgrade_async(url: str, revision: str) -> None:
    await asyncio.to_thread(downgrade, url, revision)


def head_revision() -> str | None:
    """The newest revision shipped with this code."""
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


async def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at (None for an empty database).

    Lets the bot refuse to start on a database older than its code instead of failing later
    on a missing column.
    """
    engine = make_engine(url, poolclass=NullPool)
    try:
        with _database_named(url):
            async with engine.connect() as connection:
                return await connection.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())
    finally:
        await engine.dispose()


def _known(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(alembic_config("")).get_revision(revision) is not None
    except CommandError:
        return False


class SchemaNotCurrent(RuntimeError):
    """The database's schema is not the code's, and this process was not told to migrate it."""


async def ready_schema(url: str, migrate: str = "auto") -> None:
    """Make sure the database at ``url`` is at this code's head before the bot uses it.

    ``migrate`` (ANIMEGAMER_MIGRATE_AT_START): ``always`` upgrades (on PostgreSQL under an advisory lock, so
    processes starting together upgrade once); ``never`` only checks; ``auto`` upgrades the embedded SQLite file,
    which nothing else migrates, and only checks a server database, which an operator migrates with
    ``animegamer db upgrade`` (the compose stack's `migrate` service).
    """
    if migrate == "always" or (migrate == "auto" and url.startswith("sqlite")):
        await upgrade_async(url)
        return
    current, head = await current_revision(url), head_revision()
    if current == head:
        return
    if current is None:
        state = "The database has no schema yet"
    elif not _known(current):
        state = f"The database is at revision {current}, which this code does not know (a newer version made it)"
    else:
        state = f"The database is at revision {current} and this code needs {head}"
    raise SchemaNotCurrent(
        f"{state}: run `animegamer db upgrade` with this version (after a backup), or set "
        "ANIMEGAMER_MIGRATE_AT_START=always to let the bot do it."
    )
