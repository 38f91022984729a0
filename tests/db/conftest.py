"""Shared fixtures: a freshly migrated database per test, on SQLite and on PostgreSQL, and its engine.

Every test that asks for ``db_url`` (or ``engine``, ``sessions``, ``new_db_url``) runs twice: on a
SQLite file, and on PostgreSQL at ``ANIMEGAMER_TEST_POSTGRES_URL`` (default: this machine's,
127.0.0.1:5432, trust auth, database ``test``), skipped with the reason where none answers.

On PostgreSQL the session migrates one database of its own, and each test starts from it emptied:
every row deleted and every sequence restarted (about 20 ms, where migrating or cloning a database
took 0.5 to 2 s each here). A test that changes the schema (a downgrade, an upgrade from an old
revision) asks ``new_db_url`` for an empty database of its own. Databases are named
``agtest_<pid>_...``, so sessions running at once never meet; a dead session's are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from game.contract import TurnResult
from game.state import StateDeltas
from tests import tiers
from tests.results import turn_result

POSTGRES_URL = os.environ.get("ANIMEGAMER_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
Sessions = async_sessionmaker[AsyncSession]
BACKENDS = ("sqlite", pytest.param("postgresql", marks=tiers.SLOW))  # PostgreSQL is a server: the slow tier


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


class Postgres:
    """The test server: makes and drops this session's databases through its admin database."""

    def __init__(self, url: str) -> None:
        self.url = make_url(url)
        self.prefix = f"agtest_{os.getpid()}_{secrets.token_hex(3)}"
        self.template: str | None = None
        self._count = 0
        self._unavailable: str | None = None
        self._checked = False

    def _dsn(self, database: str | None = None) -> str:
        url: URL = self.url.set(drivername="postgresql")
        if database is not None:
            url = url.set(database=database)
        return url.render_as_string(hide_password=False)

    def url_for(self, database: str) -> str:
        return self.url.set(database=database).render_as_string(hide_password=False)

    def admin(self, *statements: str, database: str | None = None) -> list[tuple]:
        """Run statements outside any transaction (CREATE/DROP DATABASE need that); the last one's rows."""
        import asyncpg

        tiers.starting("a connection to PostgreSQL")

        async def run() -> list[tuple]:
            connection = await asyncpg.connect(self._dsn(database), timeout=3)
            try:
                rows: list = []
                for statement in statements:
                    rows = await connection.fetch(statement)
                return [tuple(row) for row in rows]
            finally:
                await connection.close()

        return asyncio.run(run())

    def unavailable(self) -> str | None:
        """Why PostgreSQL cannot be used here, or None; asked once per session."""
        if not self._checked:
            self._checked = True
            try:
                import asyncpg  # noqa: F401
            except ImportError:
                self._unavailable = "asyncpg is not installed (pip install -e '.[postgres]')"
                return self._unavailable
            where = f"{self.url.host}:{self.url.port or 5432}"
            try:
                self.admin("SELECT 1")
            except Exception as exc:
                self._unavailable = (
                    f"no PostgreSQL answers at {where} ({type(exc).__name__}: {exc}); set ANIMEGAMER_TEST_POSTGRES_URL"
                )
                return self._unavailable
            self._drop_leftovers()
        return self._unavailable

    def _drop_leftovers(self) -> None:
        # Databases of test sessions that died before dropping theirs (same machine only: pids are local).
        if self.url.host not in ("127.0.0.1", "localhost", None):
            return
        for (name,) in self.admin(r"SELECT datname FROM pg_database WHERE datname LIKE 'agtest\_%'"):
            match = re.match(r"agtest_(\d+)_", name)
            if match is None or int(match.group(1)) == os.getpid():
                continue
            try:
                os.kill(int(match.group(1)), 0)
            except ProcessLookupError:
                with contextlib.suppress(Exception):
                    self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except PermissionError:
                continue

    def new_database(self, template: str = "template0") -> str:
        self._count += 1
        name = f"{self.prefix}_{self._count}"
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
        return name

    def migrated_database(self) -> str:
        """This session's database at head, every table empty and every sequence restarted."""
        if self.template is None:
            name = self.new_database()
            upgrade(self.url_for(name))
            self.template = name
        else:
            self.admin(_EMPTY_EVERY_TABLE, database=self.template)
        return self.template

    def drop(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# Deletes rather than TRUNCATE (which makes new files for every table and index: 5x slower here);
# replica mode skips the foreign-key triggers, so the order of the tables does not matter.
_EMPTY_EVERY_TABLE = """DO $$ DECLARE r record; BEGIN
SET LOCAL session_replication_role = replica;
FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version' LOOP
    EXECUTE 'DELETE FROM ' || quote_ident(r.tablename);
END LOOP;
FOR r IN SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' LOOP
    EXECUTE 'ALTER SEQUENCE ' || quote_ident(r.sequencename) || ' RESTART';
END LOOP;
END $$"""


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    server = Postgres(POSTGRES_URL)
    yield server
    if server.template is not None:
        server.drop(server.template)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, postgres: Postgres) -> str:
    if request.param == "postgresql" and (reason := postgres.unavailable()) is not None:
        pytest.skip(reason)
    return request.param


@pytest.fixture
def new_db_url(backend: str, postgres: Postgres, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """Makes empty databases on this test's backend (dropped after the test)."""
    made: list[str] = []

    def make() -> str:
        name = f"empty_{len(made)}.db" if backend == "sqlite" else postgres.new_database()
        made.append(name)
        return sqlite_url(tmp_path / name) if backend == "sqlite" else postgres.url_for(name)

    yield make
    if backend == "postgresql":
        for name in made:
            postgres.drop(name)


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file migrated to head, copied for each test (a copy takes a millisecond, a migration 0.2 s)."""
    path = tmp_path_factory.mktemp("migrated") / "game.db"
    upgrade(sqlite_url(path))
    return path


@pytest.fixture
def db_url(backend: str, postgres: Postgres, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database at head, migrated through the same path the CLI takes (a copy, or an emptied one, of it)."""
    if backend == "sqlite":
        path = tmp_path / "game.db"
        shutil.copyfile(request.getfixturevalue("migrated_sqlite"), path)
        yield sqlite_url(path)
        return
    yield postgres.url_for(postgres.migrated_database())


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    # Created inside the test's event loop and disposed there: an AsyncEngine must not outlive it.
    engine = make_engine(db_url)
    yield engine
    await engine.dispose()


@pytest.fixture
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return make_sessionmaker(engine)


@pytest.fixture
def make_result() -> Callable[..., TurnResult]:
    """A worker's result for a job, with the deltas given (stamina/social/entertainment/motion)."""

    def make(job_id: int, *, stamina: int = 0, social: int = 0, entertainment: int = 0, motion: int = 0) -> TurnResult:
        return turn_result(
            job_id,
            label="tiny model, random weights",
            deltas=StateDeltas(motion=motion, social=social, entertainment=entertainment, stamina=stamina),
            flow=1.5,
            mp4=b"\x00\x00\x00\x18ftypmp42",
            representation=f"rep-{job_id}".encode(),
            num_frames=16,
            height=64,
            width=64,
        )

    return make


@pytest.fixture
async def two_bots(db_url: str) -> AsyncIterator[tuple[Sessions, Sessions]]:
    """Two bot processes' views of one database: an engine each, as two processes would have."""
    engines = [make_engine(db_url), make_engine(db_url)]
    yield make_sessionmaker(engines[0]), make_sessionmaker(engines[1])
    for engine in engines:
        await engine.dispose()
