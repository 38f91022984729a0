"""Blocked terms against a real, migrated SQLite file: stored clean and case-folded, matched on skeletons."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from db import moderation
from game.text import TextError

Sessions = async_sessionmaker[AsyncSession]

GUILD, OTHER_GUILD, MOD = 1_000_000_000_000_000_001, 1_000_000_000_000_000_003, 44


async def _block(sessions: Sessions, *terms: str, guild_id: int = GUILD) -> list[bool]:
    async with sessions() as s, s.begin():
        return [await moderation.add_term(s, guild_id, term, MOD) for term in terms]


async def _find(sessions: Sessions, text: str, guild_id: int = GUILD) -> str | None:
    async with sessions() as s:
        return await moderation.find_blocked_term(s, guild_id, text)


async def _terms(sessions: Sessions, guild_id: int = GUILD) -> list[str]:
    async with sessions() as s:
        return await moderation.list_terms(s, guild_id)


async def test_a_term_is_stored_clean_and_case_folded(sessions: Sessions) -> None:
    assert await _block(sessions, "  Zorb–Lax\u00a0 ") == [True]
    assert await _terms(sessions) == ["zorb-lax"]


async def test_a_term_blocked_twice_in_another_spelling_is_stored_once(sessions: Sessions) -> None:
    assert await _block(sessions, "Zorb-Lax", "zorb-lax", "ZORB-LAX") == [True, False, False]
    assert await _terms(sessions) == ["zorb-lax"]


@pytest.mark.parametrize(
    "text", ["z o r b l a x", "ｚｏｒｂｌａｘ", "the zоrblax flies", "Z0RBLAX at dusk", "zorb.lax"]
)
async def test_a_stored_term_matches_its_disguised_spellings(sessions: Sessions, text: str) -> None:
    await _block(sessions, "Zorb-Lax")
    assert await _find(sessions, text) == "zorb-lax"


async def test_text_that_does_not_spell_a_term_matches_nothing(sessions: Sessions) -> None:
    await _block(sessions, "Zorb-Lax")
    assert await _find(sessions, "a zebra on a lax day") is None


async def test_terms_of_another_guild_do_not_match(sessions: Sessions) -> None:
    await _block(sessions, "zorblax", guild_id=OTHER_GUILD)
    assert await _find(sessions, "zorblax") is None


@pytest.mark.parametrize(
    ("term", "reason"),
    [
        ("---", "A blocked term needs a letter or digit."),
        ("   ", "A blocked term is empty."),
        ("zorb\u200blax", "A blocked term contains an invisible or control character (U+200B)."),
        ("x" * 101, "A blocked term is 101 characters; the most is 100."),
    ],
    ids=["no letter", "only spaces", "zero width", "too long"],
)
async def test_a_term_that_would_match_nothing_or_hide_something_is_refused(
    sessions: Sessions, term: str, reason: str
) -> None:
    with pytest.raises(TextError) as info:
        await _block(sessions, term)
    assert info.value.reason == reason
    assert await _terms(sessions) == []


async def test_a_term_is_removed_however_it_is_typed(sessions: Sessions) -> None:
    await _block(sessions, "Zorb-Lax")
    async with sessions() as s, s.begin():
        assert await moderation.remove_term(s, GUILD, "ZORB—LAX")
        assert not await moderation.remove_term(s, GUILD, "zorb-lax")
    assert await _find(sessions, "zorblax") is None
