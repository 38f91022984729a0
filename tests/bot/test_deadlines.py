"""Discord's 3-second deadline holds for every command, even with the database locked and Redis down.

The double runs strict: a first answer after 3 s is refused with 10062, as Discord does. Every slash
command is invoked at once while another process holds SQLite's write lock and the queue's Redis does
not answer; each must answer (or defer) in time, and each must end with an answer once the lock is gone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from relay.celery_app import make_celery
from tests.bot.helpers import ALL_COMMANDS, WriteLock, private_text, running_bot_on, shown
from tests.discord_double import DiscordDouble, member

ALICE = member("alice")
MOD = member("mod", manage_guild=True)


def redis_down(settings):
    """A queue whose broker and result store are both a Redis that does not answer (nothing listens on port 9)."""
    down = "redis://127.0.0.1:9/0"
    return make_celery(settings.model_copy(update={"broker_url": down, "result_backend": down, "broker_timeout": 1.0}))


@pytest.mark.slow
async def test_every_command_answers_within_the_deadline_with_the_database_locked_and_redis_down(bot_settings):
    settings = bot_settings  # a write waits 5 s for the lock: longer than the deadline
    async with DiscordDouble(strict=True) as double, running_bot_on(double, settings, redis_down(settings)):
        # Something to act on: a character, a story in the channel.
        assert "You play" in private_text(
            await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
        )
        await (await double.slash("story start", {"title": "Deadlines"}, user=ALICE)).answer()

        with WriteLock(Path(settings.database_url.removeprefix("sqlite+aiosqlite:///"))):
            handles = await asyncio.gather(
                *(
                    double.slash(command, options(double), user=MOD if command.startswith("admin") else ALICE)
                    for command, options in ALL_COMMANDS
                )
            )
            await asyncio.gather(*(handle.response(timeout=10) for handle in handles))
            late = {
                command: handle.first_callback_seconds
                for (command, _), handle in zip(ALL_COMMANDS, handles, strict=True)
                if handle.late or not handle.responded
            }
            slowest = max(handle.first_callback_seconds for handle in handles)
            await asyncio.sleep(settings.db_busy_timeout + 1)  # writers wait out the busy timeout, then say so
        answers = [shown(await handle.answer(timeout=30)) for handle in handles]

    assert late == {}, f"answered after the deadline: {late}"
    assert slowest < double.interaction_deadline
    assert all(answer.get("content") or answer.get("embeds") or answer.get("components") for answer in answers)
    busy = [c for (c, _), a in zip(ALL_COMMANDS, answers, strict=True) if "busy right now" in (a.get("content") or "")]
    assert "act" in busy  # a write that outwaited the lock says so, in one sentence, after answering in time
