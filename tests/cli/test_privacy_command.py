"""`animegamer privacy delete-user`: Discord's request to delete a user, done whole from the operator's shell."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import select, update

from animegamer.cli import main
from bot.clip_store import FolderStore
from bot.recaps import recap_key
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import Story, Turn
from db.queries import game_id
from relay.settings import get_settings
from tests.db.test_privacy import ALICE, BOB, holding, seed


async def seeded(url: str, store: FolderStore) -> str:
    """Alice and Bob in two servers, Alice's first turn with a stored clip and a kept recap of each story she
    started; returns the clip's key."""
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            await seed(session, ALICE, BOB)
            store.game = await game_id(session)
            key = store.key(100, 1)
            store.put(key, b"a clip")
            first = select(Turn.id).where(Turn.seed == 1).limit(1).scalar_subquery()
            await session.execute(update(Turn).where(Turn.id == first).values(clip_key=key))
            for story_id in (await session.execute(select(Story.id).where(Story.created_by == ALICE))).scalars():
                store.put(recap_key(store, story_id, [1], 1000), b"a recap")
        return key
    finally:
        await engine.dispose()


async def left_of(url: str, user_id: int) -> dict:
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session:
            return await holding(session, user_id)
    finally:
        await engine.dispose()


def test_a_deleted_accounts_rows_and_clips_are_gone_from_every_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'game.db'}"
    upgrade(url)
    store = FolderStore(tmp_path / "data" / "clips")
    key = asyncio.run(seeded(url, store))
    assert store.keys(f"{store.game}/recaps/")  # kept recaps of her stories, to go with her
    monkeypatch.setenv("ANIMEGAMER_DATABASE_URL", url)
    monkeypatch.setenv("ANIMEGAMER_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    try:
        assert main(["privacy", "delete-user", str(ALICE)]) == 0
    finally:
        get_settings.cache_clear()
    assert f"Deleted user {ALICE}:" in capsys.readouterr().out
    assert not any(asyncio.run(left_of(url, ALICE)).values())
    assert not store.path(key).exists() and store.keys(f"{store.game}/recaps/") == []  # the kept recaps too
    bob = asyncio.run(left_of(url, BOB))
    assert bob[("players", "user_id")] == 2 and bob[("jobs", "user_id")] == 2 and bob[("bans", "user_id")] == 1
