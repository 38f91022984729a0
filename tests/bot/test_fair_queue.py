"""The bot hands the broker a short window of turns and sends the rest server by server (game.schedule)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from game.schedule import MIN_WINDOW
from tests.bot.conftest import wait_for_db
from tests.bot.helpers import Job, accepted, idle_queue, running_bot_on
from tests.discord_double import DiscordDouble, Guild, member

WAVE = {"motion": "gently wave", "background": "day town"}


async def act(double: DiscordDouble, player, guild: Guild) -> None:
    await (await double.slash("start", {"character": "Qiqi"}, user=player, guild_id=guild.id)).answer()
    await accepted(await double.slash("act", WAVE, user=player, guild_id=guild.id))


def sent_by_user(rows) -> dict[int, bool]:
    return {user: sent is not None for user, _, sent in rows}


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "first-come-first-served"])
async def test_a_freed_place_at_the_broker_goes_to_the_quiet_server_not_the_busy_servers_next(
    bot_settings, tmp_path: Path, fair: bool
) -> None:
    busy, quiet = Guild(name="busy"), Guild(name="quiet")
    crowd = [member(f"busy{i}") for i in range(MIN_WINDOW + 2)]
    loner = member("loner")
    settings = bot_settings.model_copy(update={"fair_queue": fair})
    jobs = select(Job.user_id, Job.id, Job.sent_at).order_by(Job.id)
    async with (
        DiscordDouble([busy, quiet]) as double,
        running_bot_on(double, settings, idle_queue(settings, tmp_path)),
    ):
        for player in crowd:  # no worker takes them: the window fills, the rest wait in the bot
            await act(double, player, busy)
        await act(double, loner, quiet)
        window = await wait_for_db(settings, jobs, lambda rows: sum(sent_by_user(rows).values()) == MIN_WINDOW)
        # Which busy turns the window took is the submissions' race; the loner's came last, and waits.
        waiting = [user for user, _, sent in window if sent is None and user != loner.id]
        assert not sent_by_user(window)[loner.id] and len(waiting) == 2
        # A place at the broker frees: a busy player whose turn was sent calls it off.
        quitter = next(user for user, _, sent in window if sent is not None)
        await (
            await double.slash("cancel", user=crowd[[p.id for p in crowd].index(quitter)], guild_id=busy.id)
        ).answer()
        rows = await wait_for_db(settings, jobs, lambda rows: sum(sent_by_user(rows).values()) == MIN_WINDOW + 1)
    sent = sent_by_user(rows)
    if fair:
        assert sent[loner.id] and not any(sent[user] for user in waiting)
    else:  # the busy server's earliest waiting turn, before the loner's later one
        assert sent[waiting[0]] and not sent[waiting[1]] and not sent[loner.id]
