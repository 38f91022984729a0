"""/mydata through the loopback Discord: a player sees, takes and erases what the game keeps about them."""

from __future__ import annotations

import asyncio
import io
import json
import time
import zipfile
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import delete, func, select, update

from bot.clip_store import ClipStore
from db.models import Ban, Character, Job, JobStatus, Player, Turn
from db.queries import game_id
from tests.bot.conftest import idle_settings, read_db, running_bot
from tests.bot.helpers import accepted, clip_path, db_session, private_text, seed_turn
from tests.bot.test_fleet import database_at
from tests.db.test_privacy import holding
from tests.discord_double import member
from tests.s3_server import S3Server

ALICE, BOB, MOD = member("alice"), member("bob"), member("mod", manage_guild=True)


async def played(double, settings) -> int:
    """Alice with one finished, posted turn and its stored clip, Bob with one of his, and a ban on Alice."""
    guild = double.guild
    job_id = await seed_turn(settings, guild.id, guild.channel.id, ALICE.id, done=True)
    await seed_turn(settings, guild.id, guild.channel.id, BOB.id, character="Kiki", done=True)
    async with db_session(settings) as session:
        session.add(Ban(guild_id=guild.id, user_id=ALICE.id, reason="spam", banned_by=MOD.id))
    return job_id


async def rows_of(settings, user_id: int) -> int:
    players = await read_db(settings, select(func.count()).select_from(Player).where(Player.user_id == user_id))
    jobs = await read_db(settings, select(func.count()).select_from(Job).where(Job.user_id == user_id))
    return players[0][0] + jobs[0][0]


async def test_mydata_may_be_used_in_servers_and_in_dms(double, bot_settings):
    async with running_bot(double, bot_settings):
        (schema,) = [c for c in double.commands[None] if c["name"] == "mydata"]
    assert sorted(schema["contexts"]) == [0, 1, 2]
    assert {option["name"] for option in schema["options"]} == {"show", "export", "delete"}


async def test_show_says_what_is_kept_and_only_the_askers(double, bot_settings):
    async with running_bot(double, bot_settings):
        await played(double, bot_settings)
        said = private_text(await (await double.slash("mydata show", user=ALICE)).answer())
    assert "1 character(s) (Qiqi), 1 turn(s), 1 of them with a stored clip" in said
    assert "Banned in 1 server(s)" in said and "Kiki" not in said


async def test_export_is_a_zip_of_the_data_and_the_stored_clips(double, bot_settings):
    async with running_bot(double, bot_settings):
        job_id = await played(double, bot_settings)
        answer = await (await double.slash("mydata export", user=ALICE)).answer()
    (file,) = answer.files
    with zipfile.ZipFile(io.BytesIO(file.data)) as archive:
        data = json.loads(archive.read("data.json"))
        clip = archive.read("clips/turn_1.mp4")
    assert data["user_id"] == ALICE.id and [turn["character"] for turn in data["turns"]] == ["Qiqi"]
    assert clip == clip_path(bot_settings, double.guild.id, job_id).read_bytes()


async def test_delete_asks_first_then_erases_the_player_everywhere_and_keeps_the_ban(double, bot_settings):
    async with running_bot(double, bot_settings):
        job_id = await played(double, bot_settings)
        ask = await double.slash("mydata delete", user=ALICE)
        buttons = [c for row in (await ask.response()).json["data"]["components"] for c in row["components"]]
        confirm = next(b for b in buttons if b["label"] == "Delete everything")
        assert await rows_of(bot_settings, ALICE.id) == 2  # nothing before the click
        await (await double.button(ask.original, confirm["custom_id"], user=ALICE)).response()
        (done,) = await ask.followups(timeout=30)
        again = private_text(await (await double.slash("mydata delete", user=ALICE)).answer())
    assert "Deleted everything the game kept about you, and 1 clip file(s)." in done.json["content"]
    assert await rows_of(bot_settings, ALICE.id) == 0
    assert not clip_path(bot_settings, double.guild.id, job_id).exists()
    assert await rows_of(bot_settings, BOB.id) == 2  # Bob's turn and character are untouched
    assert await read_db(bot_settings, select(Ban.user_id)) == [(ALICE.id,)]
    assert "deleted just now" in again


async def test_no_one_else_can_confirm_a_players_deletion(double, bot_settings):
    async with running_bot(double, bot_settings):
        await played(double, bot_settings)
        ask = await double.slash("mydata delete", user=ALICE)
        buttons = [c for row in (await ask.response()).json["data"]["components"] for c in row["components"]]
        confirm, keep = (next(b for b in buttons if b["label"] == label) for label in ("Delete everything", "Keep it"))
        await double.button(ask.original, confirm["custom_id"], user=BOB)
        kept = await (await double.button(ask.original, keep["custom_id"], user=ALICE)).response()
        characters = await read_db(bot_settings, select(Character.name).order_by(Character.name))
        turns = await read_db(bot_settings, select(func.count()).select_from(Turn))
    assert kept.json["data"]["content"] == "Nothing was deleted."  # the view still waited: Bob's click did nothing
    assert characters == [("Kiki",), ("Qiqi",)] and turns == [(2,)]


async def queued(client: redis.Redis, queue: str, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (now := client.llen(queue)) != count:
        assert time.monotonic() < deadline, f"{now} message(s) on {queue}, not {count}"
        await asyncio.sleep(0.1)


@pytest.fixture
def postgres_game() -> Iterator[str]:
    with database_at("head") as url:
        yield url


@pytest.mark.slow
async def test_delete_leaves_no_row_object_or_queued_turn_of_the_player_in_postgresql_seaweedfs_or_redis(
    double, tmp_path, redis_url, postgres_game
):
    """Counted where each thing lives: every user-id column in PostgreSQL, her objects in SeaweedFS, her queued turn
    in Redis; Bob's stay."""
    s3 = S3Server(tmp_path / "seaweedfs")
    s3.start()
    try:
        base = idle_settings(tmp_path, database_url=postgres_game, broker_url=redis_url, result_backend=redis_url)
        settings = s3.settings(base, "mydata")
        queue = redis.Redis.from_url(redis_url)
        async with running_bot(double, settings):
            job_id = await played(double, settings)  # a finished turn with its clip, for the store's count
            async with db_session(settings) as session:  # that turn is history, and she is let play again
                await session.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.DONE))
                await session.execute(delete(Ban))
            await accepted(await double.slash("act", {"motion": "wave", "background": "town"}, user=ALICE))
            await queued(queue, settings.queue, 1)
            store = ClipStore.of(settings)
            async with db_session(settings) as session:
                store.game = await game_id(session)
            assert len(store.keys(f"{store.game}/")) == 2  # hers and Bob's
            ask = await double.slash("mydata delete", user=ALICE)
            buttons = [c for row in (await ask.response()).json["data"]["components"] for c in row["components"]]
            confirm = next(b for b in buttons if b["label"] == "Delete everything")
            await (await double.button(ask.original, confirm["custom_id"], user=ALICE)).response()
            await ask.followups(timeout=30)
            await queued(queue, settings.queue, 0)
            objects = store.keys(f"{store.game}/")
        async with db_session(settings) as session:
            hers, his = await holding(session, ALICE.id), await holding(session, BOB.id)
    finally:
        s3.stop()
    assert {column: rows for column, rows in hers.items() if rows} == {}
    assert objects == [store.key(double.guild.id, job_id + 1)]  # Bob's clip alone
    assert his[("players", "user_id")] == 1 and his[("jobs", "user_id")] == 1
