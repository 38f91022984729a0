"""A player's character: its card, its history, starting over."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from bot.clip_store import ClipStore
from db.engine import make_engine, make_sessionmaker
from db.models import Character, ClipDelete, Turn
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.bot.helpers import accepted, private_text, shown
from tests.discord_double import member

ALICE = member("alice")


async def start(double) -> None:
    await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()


async def test_status_shows_the_card_privately_with_the_gauges(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start(double)
        body = shown(await (await double.slash("status", user=ALICE)).answer())
    assert body["flags"] & 64
    assert body["embeds"][0]["title"] == "Qiqi"
    assert body["embeds"][0]["image"]["url"] == "attachment://state.png"


@pytest.mark.slow
async def test_history_lists_the_last_turns(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        await start(double)
        await accepted(await double.slash("act", {"motion": "gently wave", "background": "day town"}, user=ALICE))
        await wait_for_db(worker_settings, select(Turn.stamina_after), lambda rows: rows and rows[0][0] is not None)
        text = private_text(await (await double.slash("history", user=ALICE)).answer())
    assert "gently wave" in text


async def test_reset_asks_first_and_then_starts_over(double, bot_settings):
    async with running_bot(double, bot_settings):
        await start(double)
        engine = make_engine(bot_settings.database_url)
        async with make_sessionmaker(engine)() as session, session.begin():
            await session.execute(update(Character).values(stamina=5, social=95))
        await engine.dispose()

        ask = await double.slash("reset", user=ALICE)
        body = (await ask.response()).json
        buttons = [c for row in body["data"]["components"] for c in row["components"]]
        confirm = next(b for b in buttons if b["label"] == "Start over")
        assert await read_db(bot_settings, select(Character.stamina)) == [(5,)]  # nothing before the click
        click = await double.button(ask.original, confirm["custom_id"], user=ALICE)
        await click.response()
        await wait_for_db(bot_settings, select(Character.stamina, Character.social), lambda r: r == [(50, 50)])


async def reset(double) -> None:
    ask = await double.slash("reset", user=ALICE)
    buttons = [c for row in (await ask.response()).json["data"]["components"] for c in row["components"]]
    confirm = next(b for b in buttons if b["label"] == "Start over")
    await (await double.button(ask.original, confirm["custom_id"], user=ALICE)).response()


async def test_reset_deletes_the_stored_clips_of_the_turns_it_forgets(double, bot_settings):
    store = ClipStore.of(bot_settings)
    keys = ["g/1/job_1.mp4", "g/1/job_2.mp4"]
    async with running_bot(double, bot_settings):
        await start(double)
        engine = make_engine(bot_settings.database_url)
        async with make_sessionmaker(engine)() as session, session.begin():
            character = (await session.execute(select(Character))).scalar_one()
            session.add_all(
                Turn(character_id=character.id, instruction="wave", seed=1, model="tiny", clip_key=key) for key in keys
            )
        await engine.dispose()
        for key in keys:
            store.put(key, b"an mp4")
        await reset(double)
        await wait_for_db(bot_settings, select(Turn.id), lambda rows: rows == [])
        await wait_for_db(bot_settings, select(ClipDelete.key), lambda rows: rows == [])  # none left owed
    assert not any(store.exists(key) for key in keys)


async def test_reset_without_a_character_is_refused(double, bot_settings):
    async with running_bot(double, bot_settings):
        text = private_text(await (await double.slash("reset", user=ALICE)).answer())
    assert "/start" in text
