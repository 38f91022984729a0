"""/livez means working, not only running: a bot whose event loop is blocked, or whose Discord calls hang while its
gateway and database work, fails it (and logs what the loop is stuck in), and gives up the duties it holds for the
fleet (the outbox, its shards' posts) within their renew deadline instead of keeping them while doing none.

Each fault is caused for real: a synchronous call on the bot's loop, and a Discord that holds every REST request of
the bot (the double sleeps before answering).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

from db.leases import holder_of
from tests.bot.conftest import running_bot
from tests.bot.test_health import get
from tests.scrape import free_port

# A bot that gives its duties up 2 s into being stuck (two thirds of its 3 s hold) and fails /livez at 2.5 s: the
# defaults (10 s, 20 s) scaled down, in the same proportions, for a test that waits seconds, not half a minute.
QUICK_LIVENESS = {"duty_seconds": 3.0, "discord_timeout": 1.0, "liveness_seconds": 2.5}


def block_the_event_loop(seconds: float) -> None:
    """What a blocking library call on the loop does: nothing else on it runs until it returns."""
    time.sleep(seconds)


def poll_livez(port: int, seconds: float) -> list[tuple[int, dict]]:
    """/livez every quarter second for ``seconds``, from the calling thread."""
    answers = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, body = get(port, "/livez")
        answers.append((status, json.loads(body)))
        time.sleep(0.25)
    return answers


async def until(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` (the bot's own state, which no call to the double announces)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


async def test_a_bot_whose_event_loop_is_blocked_fails_livez_and_logs_what_the_loop_is_stuck_in(
    double, bot_settings, caplog
) -> None:
    port = free_port()
    settings = bot_settings.model_copy(update={"metrics_port": port, **QUICK_LIVENESS})
    with caplog.at_level(logging.ERROR, logger="bot.liveness"):
        async with running_bot(double, settings):
            before = await asyncio.to_thread(get, port, "/livez")
            answers: list[tuple[int, dict]] = []
            # Asked from a thread of its own: the test's coroutines run on the loop that is about to be blocked.
            watcher = threading.Thread(target=lambda: answers.extend(poll_livez(port, 5.0)))
            watcher.start()
            block_the_event_loop(4.0)
            await asyncio.to_thread(watcher.join)
            after = await asyncio.to_thread(get, port, "/livez")
    assert before[0] == 200 and after[0] == 200  # alive before, and again once the loop runs
    failed = [report for status, report in answers if status == 503]
    assert failed and "the event loop has been blocked for" in failed[0]["stuck"][0], answers
    stacks = [r.getMessage() for r in caplog.records if "loop thread traceback" in r.getMessage()]
    assert len(stacks) == 1 and "block_the_event_loop" in stacks[0]  # once per blockage, naming the blocking call


async def test_a_bot_whose_discord_calls_hang_gives_up_its_duties_and_fails_livez_then_takes_them_again(
    double, bot_settings
) -> None:
    """Its gateway and database work; only Discord's REST holds its requests (a command's deferral here). Within the
    renew deadline it holds neither the outbox nor its shard's posts, and /livez fails naming Discord; once Discord
    answers again it takes its duties back."""
    port = free_port()
    settings = bot_settings.model_copy(update={"metrics_port": port, **QUICK_LIVENESS})
    async with running_bot(double, settings) as bot:
        await until(lambda: bot.outbox.lease.sure() and bot.posting.posts(double.guild.id), 10, "its duties held")
        hang = double.fail("*", r".*", status=0, delay=30.0, times=None)  # held until cleared
        await double.slash("start", {"character": "Qiqi"}, user=double.player)  # its deferral hangs
        await until(lambda: not bot.outbox.lease.sure(), 10, "the outbox given up")
        gave_up_posts = not bot.posting.posts(double.guild.id)
        for _ in range(50):  # the give-up is written just after the process stops relying on it
            async with bot.sessions() as session:
                outbox_holder = await holder_of(session, "outbox")
            if outbox_holder is None:
                break
            await asyncio.sleep(0.1)
        status, body = await asyncio.to_thread(get, port, "/livez")
        for _ in range(40):
            if status == 503:
                break
            await asyncio.sleep(0.1)
            status, body = await asyncio.to_thread(get, port, "/livez")
        hang.clear()
        await double.slash("start", {"character": "Qiqi"}, user=double.player)  # answered: Discord is back
        await until(lambda: bot.outbox.lease.sure(), 10, "the outbox taken again")
    assert outbox_holder is None  # given up in the database, so another process takes it at its next try
    assert gave_up_posts
    assert status == 503 and "Discord's REST has not answered for" in " ".join(json.loads(body)["stuck"])
