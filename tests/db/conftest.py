"""Shared fixtures: a freshly migrated SQLite file per test, and an engine bound to the test's loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from game.contract import TurnResult
from game.state import StateDeltas


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A database file upgraded to head through the same path the CLI takes."""
    url = sqlite_url(tmp_path / "game.db")
    upgrade(url)
    return url


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
        return TurnResult(
            job_id=str(job_id),
            model="tiny",
            label="tiny model, random weights",
            seed=7,
            deltas=StateDeltas(motion=motion, social=social, entertainment=entertainment, stamina=stamina),
            flow=1.5,
            mp4=b"\x00\x00\x00\x18ftypmp42",
            representation=f"rep-{job_id}".encode(),
            num_frames=16,
            height=64,
            width=64,
            fps=8,
        )

    return make
