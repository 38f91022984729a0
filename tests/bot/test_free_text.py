"""Any Unicode in any free-text option: the command answers in time, nothing stored is invisible, nobody is pinged.

A property test over arbitrary text (surrogates, controls, bidi overrides, zero-width and private-use
characters included) typed into every option a player or an admin can fill freely. One bot runs for all
examples, on an event loop of its own thread, so hypothesis can draw, shrink and replay examples against
it from this (synchronous) test.
"""

from __future__ import annotations

import asyncio
import threading
import unicodedata
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from db.models import AuditLog, Ban, BlockedTerm, Character, Story, Turn
from tests.bot.conftest import read_db
from tests.bot.helpers import idle_queue, running_bot_on
from tests.discord_double import DiscordDouble, member

T = TypeVar("T")
PLAYER, MOD, VICTIM = member("alice"), member("mod", manage_guild=True), member("victim")
INVISIBLE = {"Cc", "Cf", "Co", "Cn", "Cs"}

# (command, the free-text option, its most characters as Discord enforces it, the other options it needs)
FREE_TEXT = [
    ("act", "motion", 60, {"background": "town"}),
    ("act", "background", 60, {"motion": "wave"}),
    ("act", "instruction", 200, {}),
    ("start", "character", 60, {}),
    ("story start", "title", 100, {}),
    ("admin terms add", "term", 100, {}),
    ("admin ban", "reason", 200, {"user": VICTIM}),
]
ANY_CHARACTER = st.characters(blacklist_categories=())  # surrogates and unassigned code points included


class BotThread:
    """The strict double and the real bot, running on their own event loop in a thread."""

    def __init__(self, bot_settings: Any, queue: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bot-under-test", daemon=True)
        self.thread.start()
        self.settings, self.queue = bot_settings, queue
        self.run(self._start())

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _start(self) -> None:
        self.double = DiscordDouble(strict=True)
        await self.double.__aenter__()
        self._bot = running_bot_on(self.double, self.settings, self.queue)
        await self._bot.__aenter__()
        await (await self.double.slash("start", {"character": "Qiqi"}, user=PLAYER)).answer()

    async def _stop(self) -> None:
        await self._bot.__aexit__(None, None, None)
        await self.double.__aexit__(None, None, None)

    def stop(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


async def invoke(double: DiscordDouble, command: str, option: str, text: str, others: dict) -> None:
    user = MOD if command.startswith("admin") else PLAYER
    handle = await double.slash(command, {**others, option: text}, user=user)
    await handle.answer(timeout=20)
    assert not handle.late and handle.responded, f"/{command} {option}: answered after the deadline"
    if command == "story start":
        await (await double.slash("story end", user=PLAYER)).answer(timeout=20)  # free the channel again


def stored_text(settings: Any) -> list[str]:
    """Every text the bot stores from what players and admins type."""
    columns = (
        Character.name,
        Story.title,
        BlockedTerm.term,
        Ban.reason,
        Turn.instruction,
        AuditLog.target,
        AuditLog.details,
    )
    rows: list[str] = []
    for column in columns:
        rows += [value for (value,) in asyncio.run(read_db(settings, select(column))) if value]
    return rows


def allows_pings(call: Any, player_id: int) -> bool:
    """Whether a message the bot sent could ping anyone but the player it answers."""
    body = call.json if isinstance(call.json, dict) else {}
    message = (body.get("data") or {}) if "type" in body else body
    if not message.get("content"):
        return False
    mentions = message.get("allowed_mentions")
    if mentions is None:
        return True  # without allowed_mentions, Discord pings whatever the content mentions
    users = {int(u) for u in mentions.get("users", [])}
    return bool(set(mentions.get("parse", [])) or users - {player_id} or mentions.get("roles"))


@pytest.mark.slow
def test_any_unicode_in_any_free_text_option_is_answered_in_time_stored_clean_and_pings_nobody(
    worker_settings, sqlite_worker, tmp_path: Path
):
    running = BotThread(worker_settings, idle_queue(worker_settings, tmp_path))
    try:

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(data=st.data())
        def check(data: st.DataObject) -> None:
            command, option, most, others = data.draw(st.sampled_from(FREE_TEXT))
            text = data.draw(st.text(ANY_CHARACTER, min_size=1, max_size=most))
            running.run(invoke(running.double, command, option, text, others))

        check()
        calls = list(running.double.calls)
    finally:
        running.stop()

    for value in stored_text(worker_settings):
        hidden = [f"U+{ord(c):04X}" for c in value if unicodedata.category(c) in INVISIBLE]
        assert not hidden, f"stored text {value!r} holds {hidden}"
    writes = [
        c
        for c in calls
        if c.method in ("POST", "PATCH") and ("/messages" in c.path or "/callback" in c.path or "/webhooks/" in c.path)
    ]
    pinging = [c.path for c in writes if allows_pings(c, PLAYER.id)]
    assert not pinging, f"messages that could ping someone: {pinging[:5]}"
