"""Retention: old turns lose their clip files and representations; each character's and story's newest keep theirs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import undefer

from bot.clip_store import FolderStore
from db import jobs as j
from db import queries as q
from db.base import utcnow
from db.models import Character, Story, Turn
from db.retention import sweep
from game.contract import TurnResult
from game.history import MAX_WINDOW

Sessions = async_sessionmaker[AsyncSession]
MakeResult = Callable[..., TurnResult]

GUILD, CHANNEL = 1_000_000_000_000_000_001, 2_000_000_000_000_000_002
ALICE, BOB = 11, 22
LINE = "Character: {name}; Motion: wave; Background: town."
OLD = timedelta(days=40)


async def _character(sessions: Sessions, user_id: int, name: str = "Qiqi") -> int:
    async with sessions() as s, s.begin():
        return (await q.get_or_create_character(s, GUILD, user_id, name)).id


async def _play(
    sessions: Sessions,
    make_result: MakeResult,
    character_id: int,
    clips: Path,
    *,
    story_id: int | None = None,
    age: timedelta = OLD,
    key: str = "toy",
) -> int:
    """A finished turn made ``age`` ago, with its clip file on disk; returns the turn's id."""
    async with sessions() as s, s.begin():
        turn, job = await j.create_turn(
            s, character_id, LINE.format(name="Qiqi"), 1, "toy", story=story_id, model_key=key
        )
        clip = clips / f"job_{job.id}.mp4"
        clip.write_bytes(b"clip")
        assert await j.apply_result(s, job.id, make_result(job.id), clip.name)  # its key in the clip store
        await s.execute(update(Turn).where(Turn.id == turn.id).values(created_at=utcnow() - age))
        return turn.id


async def _kept(sessions: Sessions) -> dict[int, tuple[bool, bool]]:
    """Each turn: (still has its representation, still has its clip)."""
    async with sessions() as s:
        rows = await s.execute(select(Turn.id, Turn.representation.is_not(None), Turn.clip_key.is_not(None)))
        return {turn_id: (rep, clip) for turn_id, rep, clip in rows}


@pytest.fixture
def clips(tmp_path: Path) -> Path:
    folder = tmp_path / "clips"
    folder.mkdir()
    return folder


async def test_old_turns_lose_both_and_the_characters_newest_five_keep_both(
    sessions: Sessions, make_result: MakeResult, clips: Path
) -> None:
    alice = await _character(sessions, ALICE)
    turns = [await _play(sessions, make_result, alice, clips) for _ in range(8)]
    swept = await sweep(sessions, representation_days=7, clip_days=30, delete_clips=FolderStore(clips).delete)
    newest = set(turns[-MAX_WINDOW:])
    assert await _kept(sessions) == {t: (t in newest, t in newest) for t in turns}
    assert (swept.representations, swept.clips) == (3, 3)
    assert sorted(p.name for p in clips.iterdir()) == sorted(f"job_{t}.mp4" for t in turns[-MAX_WINDOW:])


async def test_recent_turns_keep_both_whatever_their_number(
    sessions: Sessions, make_result: MakeResult, clips: Path
) -> None:
    alice = await _character(sessions, ALICE)
    turns = [await _play(sessions, make_result, alice, clips, age=timedelta(days=2)) for _ in range(8)]
    await sweep(sessions, representation_days=7, clip_days=30, delete_clips=FolderStore(clips).delete)
    assert await _kept(sessions) == {t: (True, True) for t in turns}


async def test_each_setting_has_its_own_age_and_zero_keeps_forever(
    sessions: Sessions, make_result: MakeResult, clips: Path
) -> None:
    alice = await _character(sessions, ALICE)
    turns = [await _play(sessions, make_result, alice, clips, age=timedelta(days=10)) for _ in range(7)]
    await sweep(sessions, representation_days=7, clip_days=0, delete_clips=FolderStore(clips).delete)
    assert await _kept(sessions) == {t: (t in turns[-MAX_WINDOW:], True) for t in turns}


async def test_a_storys_newest_five_keep_both_though_each_player_played_more_since(
    sessions: Sessions, make_result: MakeResult, clips: Path
) -> None:
    alice, bob = await _character(sessions, ALICE), await _character(sessions, BOB, "Sosuke")
    async with sessions() as s, s.begin():
        story_id = (await q.create_story(s, GUILD, CHANNEL, "Night flight", created_by=ALICE)).id
    story_turns = [await _play(sessions, make_result, c, clips, story_id=story_id) for c in (alice, bob) * 3]
    solo = [await _play(sessions, make_result, c, clips) for c in (alice, bob) * MAX_WINDOW]
    async with sessions() as s:
        story = await s.get_one(Story, story_id)
        history_before = await j.build_history(s, story, window=MAX_WINDOW, model_key="toy")
    await sweep(sessions, representation_days=7, clip_days=30, delete_clips=FolderStore(clips).delete)
    kept = {t for t, (rep, _) in (await _kept(sessions)).items() if rep}
    assert kept == set(story_turns[-MAX_WINDOW:]) | set(solo)
    async with sessions() as s:
        story = await s.get_one(Story, story_id)
        assert await j.build_history(s, story, window=MAX_WINDOW, model_key="toy") == history_before


async def test_the_next_prompts_history_is_the_same_after_a_sweep(
    sessions: Sessions, make_result: MakeResult, clips: Path
) -> None:
    alice = await _character(sessions, ALICE)
    for key in ("toy", "animegamer:qiqi"):  # the weights changed once: each key keeps its own newest
        for _ in range(7):
            await _play(sessions, make_result, alice, clips, key=key)

    async def histories() -> list[list[bytes]]:
        async with sessions() as s:
            character = await s.get_one(Character, alice)
            return [
                [h.representation for h in await j.build_history(s, character, MAX_WINDOW, key)]
                for key in ("toy", "animegamer:qiqi")
            ]

    before = await histories()
    await sweep(sessions, representation_days=1, clip_days=1, delete_clips=FolderStore(clips).delete)
    assert await histories() == before
    assert all(len(h) == MAX_WINDOW - 1 for h in before)


async def test_a_sweep_goes_batch_by_batch_through_every_old_turn(
    sessions: Sessions, make_result: MakeResult, clips: Path
) -> None:
    characters = [await _character(sessions, user) for user in range(100, 104)]
    turns = [await _play(sessions, make_result, c, clips) for c in characters * 7]
    swept = await sweep(sessions, representation_days=7, clip_days=30, size=3, delete_clips=FolderStore(clips).delete)
    assert (swept.representations, swept.clips) == (4 * 2, 4 * 2)
    assert sum(rep for rep, _ in (await _kept(sessions)).values()) == len(turns) - 8


async def test_an_expired_clip_is_recorded_and_a_missing_file_is_no_error(
    sessions: Sessions, make_result: MakeResult, clips: Path
) -> None:
    alice = await _character(sessions, ALICE)
    turns = [await _play(sessions, make_result, alice, clips) for _ in range(MAX_WINDOW + 1)]
    (clips / f"job_{turns[0]}.mp4").unlink()  # someone removed it by hand already
    swept = await sweep(sessions, representation_days=0, clip_days=30, delete_clips=FolderStore(clips).delete)
    assert swept.files_missing == [f"job_{turns[0]}.mp4"]
    async with sessions() as s:
        oldest = await s.get_one(Turn, turns[0], options=[undefer(Turn.representation)])
    assert oldest.clip_key is None and oldest.clip_expired_at is not None
    assert oldest.representation is not None  # representations are kept forever (0 days)
