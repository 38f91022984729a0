"""Shared story channels: three players, one world, the story's own history."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from db.engine import make_engine, make_sessionmaker
from db.models import Character, GuildSettings, Job, Story, Turn
from game.contract import HistoryTurn, TurnRequest
from game.state import StateDeltas
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.discord_double import member

PLAYERS = [member("alice"), member("bob"), member("carol")]
NAMES = ["Qiqi", "Sosuke", "Kiki"]
MOVES = [("gently fly on broomstick", "night sky"), ("quickly run", "day town"), ("gently wave", "day street")]


async def set_history_window(settings, window: int) -> None:
    engine = make_engine(settings.database_url)
    async with make_sessionmaker(engine)() as session, session.begin():
        await session.execute(update(GuildSettings).values(history_window=window))
    await engine.dispose()


async def begin_story(double, order: str = "free") -> None:
    await (await double.slash("story start", {"title": "Night flight", "order": order}, user=PLAYERS[0])).response()
    for player, name in zip(PLAYERS, NAMES, strict=True):
        await (await double.slash("start", {"character": name}, user=player)).response()
        await (await double.slash("story join", user=player)).response()


async def story_turn(double, settings, player, motion, background, done: int) -> None:
    handle = await double.slash("story act", {"motion": motion, "background": background}, user=player)
    assert (await handle.response()).json["type"] == 5
    await wait_for_db(
        settings, select(Job.result_message_id), lambda rows: sum(r[0] is not None for r in rows) == done, timeout=90
    )


@pytest.mark.slow
async def test_three_players_turns_are_recorded_in_order_and_carry_the_storys_history(
    double, bot_settings, sqlite_worker, tiny_pipeline
):
    async with running_bot(double, bot_settings, sqlite_worker):
        await begin_story(double)
        await set_history_window(bot_settings, 3)
        for done, (player, (motion, background)) in enumerate(zip(PLAYERS, MOVES, strict=True), start=1):
            await story_turn(double, bot_settings, player, motion, background, done)

    rows = await read_db(
        bot_settings, select(Turn, Character.name).join(Character).where(Turn.story_id.is_not(None)).order_by(Turn.seq)
    )
    assert [(turn.seq, name) for turn, name in rows] == [(1, "Qiqi"), (2, "Sosuke"), (3, "Kiki")]

    # Carol's turn was made with the story's two earlier turns (Alice's and Bob's) as its history:
    # the same request, computed here by the same tiny model, gives the representation the bot stored.
    past = [
        HistoryTurn(
            instruction=turn.instruction,
            representation=turn.representation,
            deltas=StateDeltas(
                motion=turn.d_motion, social=turn.d_social, entertainment=turn.d_entertainment, stamina=turn.d_stamina
            ),
        )
        for turn, _ in rows[:2]
    ]
    carol = rows[2][0]
    expected = tiny_pipeline(TurnRequest(job_id="check", instruction=carol.instruction, seed=carol.seed, history=past))
    assert expected.representation == carol.representation
    alone = tiny_pipeline(TurnRequest(job_id="check", instruction=carol.instruction, seed=carol.seed))
    assert alone.representation != carol.representation


async def test_round_robin_refuses_a_player_out_of_turn(double, bot_settings, sqlite_worker):
    async with running_bot(double, bot_settings, sqlite_worker):
        await begin_story(double, order="round_robin")
        handle = await double.slash("story act", {"motion": "quickly run", "background": "town"}, user=PLAYERS[1])
        body = (await handle.response()).json
    assert body["data"]["flags"] & 64 and "Qiqi's turn" in body["data"]["content"]
    assert await read_db(bot_settings, select(Turn.id)) == []


async def test_a_second_story_in_the_same_channel_is_refused(double, bot_settings, sqlite_worker):
    async with running_bot(double, bot_settings, sqlite_worker):
        await begin_story(double)
        handle = await double.slash("story start", {"title": "Another"}, user=PLAYERS[1])
        body = (await handle.response()).json
    assert "already has a story" in body["data"]["content"]
    assert len(await read_db(bot_settings, select(Story.id))) == 1


@pytest.mark.slow
async def test_recap_posts_the_story_as_one_clip_and_a_link_free_summary(double, bot_settings, sqlite_worker):
    async with running_bot(double, bot_settings, sqlite_worker):
        await begin_story(double)
        for done, (player, (motion, background)) in enumerate(zip(PLAYERS[:2], MOVES[:2], strict=True), start=1):
            await story_turn(double, bot_settings, player, motion, background, done)
        recap = await double.slash("story recap", user=PLAYERS[2])
        (followup,) = await recap.followups(timeout=60)
    (clip,) = [f for f in followup.files if f.filename.endswith(".mp4")]
    import io

    import av

    with av.open(io.BytesIO(clip.data)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 34  # two 17-frame turns
    text = followup.json["content"]
    assert "gently fly on broomstick" in text and "quickly run" in text and "http" not in text


async def test_end_archives_the_story_and_frees_the_channel(double, bot_settings, sqlite_worker):
    async with running_bot(double, bot_settings, sqlite_worker):
        await begin_story(double)
        await (await double.slash("story end", user=PLAYERS[0])).response()
        again = await double.slash("story start", {"title": "Sequel"}, user=PLAYERS[0])
        assert "Sequel" in (await again.response()).json["data"]["content"]
    assert sorted(s for (s,) in await read_db(bot_settings, select(Story.status))) == ["active", "archived"]
