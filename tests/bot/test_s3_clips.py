"""Clips in an S3-compatible store: a real SeaweedFS server on 127.0.0.1, with credentials of its own.

The store keeps, reads, lists and deletes clips as the folder does; recaps are made from it and kept in it; the bot
posts a clip it reads from it; `animegamer check` names the bucket and the endpoint when it cannot use them, never
the secret.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import av
import pytest
from pydantic import SecretStr
from sqlalchemy import select

from animegamer.checks import run_checks
from bot.clip_store import ClipStore, FolderStore, S3Store
from bot.recaps import forget, recap_file, recap_key
from db.models import ClipDelete, Job, Story
from relay.settings import Settings
from tests.bot.clip_samples import FRAMES, story_clips
from tests.bot.conftest import idle_settings, read_db, running_bot, settings_beside, wait_for_db
from tests.bot.helpers import accepted, count_rows, game_store, kept_recaps, private_text, seed_turn
from tests.discord_double import Channel, DiscordDouble, Guild
from tests.s3_server import S3Server

pytestmark = pytest.mark.slow  # each module starts a SeaweedFS server


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ClipStore:
    if request.param == "folder":
        return FolderStore(tmp_path / "clips")
    s3: S3Server = request.getfixturevalue("s3")
    return ClipStore.of(s3.settings(Settings(data_dir=tmp_path), prefix=tmp_path.name))


def test_a_store_keeps_reads_lists_and_deletes_clips(store: ClipStore, tmp_path: Path) -> None:
    store.put("1/job_1.mp4", b"first")
    (tmp_path / "local.mp4").write_bytes(b"second" * 100_000)
    store.put_file("1/job_2.mp4", tmp_path / "local.mp4")
    store.copy_to("1/job_2.mp4", tmp_path / "copy.mp4")
    assert store.get("1/job_1.mp4") == b"first" and (tmp_path / "copy.mp4").read_bytes() == b"second" * 100_000
    assert store.keys("1/") == ["1/job_1.mp4", "1/job_2.mp4"] and store.keys("2/") == []
    assert store.exists("1/job_1.mp4") and not store.exists("1/job_3.mp4")
    store.delete(["1/job_1.mp4"])
    assert store.keys("1/") == ["1/job_2.mp4"]
    with pytest.raises(FileNotFoundError):
        store.get("1/job_1.mp4")
    with pytest.raises(FileNotFoundError):
        store.copy_to("1/job_1.mp4", tmp_path / "gone.mp4")


def test_a_recap_is_made_from_the_store_kept_in_it_and_reused(store: ClipStore, tmp_path: Path) -> None:
    for turn, clip in enumerate(story_clips(tmp_path / "made", turns=2), start=1):
        store.put(f"1/job_{turn}.mp4", clip.read_bytes())
    clips = [(1, "1/job_1.mp4"), (2, "1/job_2.mp4")]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    made, fresh = recap_file(store, 5, clips, 10 * 1024 * 1024, tmp_path / "a")
    again, reused = recap_file(store, 5, clips, 10 * 1024 * 1024, tmp_path / "b")
    assert (fresh, reused) == (True, False) and again.read_bytes() == made.read_bytes()
    with av.open(str(again)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 2 * FRAMES
    assert len(store.keys("recaps/")) == 1
    forget(store, 5)
    assert store.keys("recaps/") == []


async def test_the_bot_posts_a_clip_it_reads_from_the_store(s3: S3Server, tmp_path: Path, double) -> None:
    settings = s3.settings(idle_settings(tmp_path, database_url=f"sqlite+aiosqlite:///{tmp_path}/game.db"), "post")
    async with running_bot(double, settings):
        where = (double.guild.id, double.guild.channel.id, double.player.id)
        job_id = await seed_turn(settings, *where, done=True, posted=False)
        store = game_store(settings)
        assert isinstance(store, S3Store)
        ((message_id,),) = await wait_for_db(
            settings, select(Job.result_message_id).where(Job.id == job_id), lambda rows: rows[0][0], timeout=30
        )
    (clip,) = [f for f in double.message(message_id).files.values() if f.filename.endswith(".mp4")]
    assert clip.data == store.get(store.key(double.guild.id, job_id))


def test_check_names_the_bucket_and_the_endpoint_on_wrong_credentials_and_never_the_secret(
    s3: S3Server, tmp_path: Path
) -> None:
    settings = s3.settings(Settings(data_dir=tmp_path)).model_copy(
        update={"aws_secret_access_key": SecretStr("n0t/the+one")}
    )
    (result,) = [r for r in run_checks(settings) if r.name == "clip store"]
    assert result.status == "fail" and f"s3://{s3.bucket}/" in result.detail and s3.endpoint in result.detail
    assert "n0t/the+one" not in str(result) and s3.secret_key not in str(result)


def test_check_names_a_missing_bucket(s3: S3Server, tmp_path: Path) -> None:
    settings = s3.settings(Settings(data_dir=tmp_path)).model_copy(update={"clip_store": "s3://no-such-bucket/x"})
    (result,) = [r for r in run_checks(settings) if r.name == "clip store"]
    assert result.status == "fail" and "the bucket no-such-bucket does not exist at" in result.detail
    assert "create the bucket" in result.fix


def test_check_passes_on_the_store(s3: S3Server, tmp_path: Path) -> None:
    (result,) = [r for r in run_checks(s3.settings(Settings(data_dir=tmp_path))) if r.name == "clip store"]
    assert result.status == "ok", result


async def test_a_turn_made_by_a_worker_is_stored_in_the_bucket_and_posted_from_it(
    s3: S3Server, sqlite_worker, tmp_path: Path, double
) -> None:
    settings = s3.settings(settings_beside(sqlite_worker, tmp_path), "turns")
    async with running_bot(double, settings, sqlite_worker):
        assert "You play" in (await (await double.slash("start", {"character": "Qiqi"})).answer()).json["content"]
        await accepted(await double.slash("act", {"motion": "gently wave", "background": "day town"}))
        ((job_id, message_id),) = await wait_for_db(
            settings, select(Job.id, Job.result_message_id), lambda rows: rows and rows[0][1], timeout=90
        )
    (clip,) = [f for f in double.message(message_id).files.values() if f.filename.endswith(".mp4")]
    store = game_store(settings)
    assert store.get(store.key(double.guild.id, job_id)) == clip.data
    assert not (tmp_path / "clips").exists()  # nothing of it in a folder


async def test_a_store_that_is_down_while_a_turn_finishes_delays_its_post_and_loses_nothing(
    sqlite_worker, tmp_path: Path, double
) -> None:
    """The store is killed as the turn is taken: the made turn waits (the player told once that it is late), and
    once the store is back its clip is written and posted, once."""
    own = S3Server(tmp_path / "seaweedfs")
    own.start()
    try:
        settings = own.settings(settings_beside(sqlite_worker, tmp_path), "outage")
        async with running_bot(double, settings, sqlite_worker):
            await (await double.slash("start", {"character": "Qiqi"})).answer()
            own.stop()
            progress = await double.slash("act", {"motion": "gently wave", "background": "day town"})
            await accepted(progress)
            await double.wait_until(lambda: "late" in progress.original.content, 90, "the late notice")
            await asyncio.sleep(3)  # a few more tries against the stopped store
            own.start()
            ((message_id,),) = await wait_for_db(
                settings, select(Job.result_message_id), lambda rows: rows and rows[0][0], timeout=120
            )
            edits = [str((c.json or {}).get("content", "")) for c in double.calls_to("PATCH", r".*")]
    finally:
        own.stop()
    (clip,) = [f for f in double.message(message_id).files.values() if f.filename.endswith(".mp4")]
    assert len(clip.data) > 1000
    assert sum("Made, but late" in text for text in edits) == 1  # told once
    assert len([m for m in double.messages() if any(f.filename.endswith(".mp4") for f in m.files.values())]) == 1


async def test_purging_a_player_deletes_their_clips_from_the_store(s3: S3Server, tmp_path: Path, double) -> None:
    settings = s3.settings(idle_settings(tmp_path, database_url=f"sqlite+aiosqlite:///{tmp_path}/game.db"), "purge")
    async with running_bot(double, settings):
        job_id = await seed_turn(settings, double.guild.id, double.guild.channel.id, double.player.id, done=True)
        store = game_store(settings)
        key = store.key(double.guild.id, job_id)
        assert store.exists(key)
        purge = await double.slash("admin purge", {"user": double.player}, user=double.guild.owner)
        assert "1 clip file(s)" in (await purge.answer()).json["content"]
    assert not store.exists(key)


async def test_a_store_that_is_down_when_a_clip_is_to_be_posted_delays_the_post_and_it_goes_out_with_its_clip(
    sqlite_worker, tmp_path: Path, double
) -> None:
    """Discord refuses posts for a while (408, which the bot retries itself) once the turn is made and its clip
    stored; the store is killed, Discord lets posts through: the post waits for the store (the player told once),
    and goes out with its clip, once."""
    own = S3Server(tmp_path / "seaweedfs")
    own.start()
    try:
        settings = own.settings(settings_beside(sqlite_worker, tmp_path), "posting")
        async with running_bot(double, settings, sqlite_worker):
            await (await double.slash("start", {"character": "Qiqi"})).answer()
            refused = double.fail("POST", r"/channels/\d+/messages", status=408, times=None)
            await accepted(await double.slash("act", {"motion": "gently wave", "background": "day town"}))
            await double.wait_until(lambda: refused.hits >= 1, 90, "a refused post of the made turn")
            own.stop()
            double.clear_faults()
            told = "cannot read the clip"
            await double.wait_until(
                lambda: any(told in str((c.json or {}).get("content")) for c in double.calls_to("PATCH", r".*")),
                60,
                "the late notice",
            )
            await asyncio.sleep(3)  # a few more tries against the stopped store
            own.start()
            ((message_id,),) = await wait_for_db(
                settings, select(Job.result_message_id), lambda rows: rows[0][0], timeout=120
            )
            edits = [str((c.json or {}).get("content", "")) for c in double.calls_to("PATCH", r".*")]
    finally:
        own.stop()
    (clip,) = [f for f in double.message(message_id).files.values() if f.filename.endswith(".mp4")]
    assert len(clip.data) > 1000
    assert sum(told in text for text in edits) == 1
    assert len([m for m in double.messages() if any(f.filename.endswith(".mp4") for f in m.files.values())]) == 1


async def test_two_games_on_one_bucket_never_read_or_delete_each_others_clips_or_recaps(
    s3: S3Server, sqlite_worker, tmp_path: Path
) -> None:
    """Two games (a database each) on one bucket and prefix, each with its job 1 in the same server (a channel each:
    one bot user posting job 1 twice in one channel would be folded by Discord's nonce) and a recap of its story 5:
    job and story ids start at 1 in every game, so before keys carried the game's id the second game's purge
    deleted the first game's clip, and the second game's recap was the first game's, reused."""
    guild = Guild(channels=[Channel("first"), Channel("second")])
    stores = []
    async with DiscordDouble([guild]) as double:
        for game, channel in zip(("first", "second"), guild.channels, strict=True):
            settings = s3.settings(settings_beside(sqlite_worker, tmp_path / game), "shared")
            async with running_bot(double, settings, sqlite_worker):
                await (await double.slash("start", {"character": "Qiqi"}, channel_id=channel.id)).answer()
                wave = {"motion": "gently wave", "background": "day town"}
                await accepted(await double.slash("act", wave, channel_id=channel.id))
                ((job_id, message_id),) = await wait_for_db(
                    settings, select(Job.id, Job.result_message_id), lambda rows: rows and rows[0][1], timeout=90
                )
                store = game_store(settings)
                (clip,) = [f for f in double.message(message_id).files.values() if f.filename.endswith(".mp4")]
                assert job_id == 1 and store.get(store.key(guild.id, 1)) == clip.data, game
                stores.append(store)
                if game == "second":  # the second game purges its player, and its clip with them
                    purge = await double.slash("admin purge", {"user": double.player}, user=guild.owner)
                    assert "1 clip file(s)" in (await purge.answer()).json["content"]
    first, second = stores
    assert first.game != second.game
    assert first.exists(first.key(guild.id, 1)) and not second.exists(second.key(guild.id, 1))
    recaps = []
    for store in (first, second):
        (tmp_path / store.game).mkdir()
        store.put(store.key(guild.id, 2), first.get(first.key(guild.id, 1)))  # its story's clip
        clips = [(1, store.key(guild.id, 2))]
        recaps.append(recap_file(store, 5, clips, 10 * 1024 * 1024, tmp_path / store.game))
    assert [fresh for _, fresh in recaps] == [True, True]  # the second game's recap is its own, not the first's
    forget(first, 5)
    assert kept_recaps(first) == [] and len(kept_recaps(second)) == 1


async def test_a_removal_and_a_purge_while_the_store_is_down_delete_their_clips_once_it_is_back(
    tmp_path: Path, double
) -> None:
    """SeaweedFS is killed; an admin removes one turn's clip, purges another player and ends a story with a kept
    recap: each answer says the stored clip is still to go, the deletions are recorded, and once the store is back
    every object is gone and nothing is owed (each bot process's retention loop retries what is owed). Before,
    S3Store.delete logged the outage after the keys were cleared, and the objects stayed in the bucket for good."""
    own = S3Server(tmp_path / "seaweedfs")
    own.start()
    try:
        database = f"sqlite+aiosqlite:///{tmp_path}/game.db"
        settings = own.settings(idle_settings(tmp_path, database_url=database, retention_interval_seconds=1), "owed")
        owner = double.guild.owner
        async with running_bot(double, settings):
            where = (double.guild.id, double.guild.channel.id)
            removed = await seed_turn(settings, *where, owner.id, done=True)
            await seed_turn(settings, *where, double.player.id, done=True)
            store = game_store(settings)
            keys = store.keys(f"{store.game}/")
            assert len(keys) == 2
            await (await double.slash("story start", {"title": "Night flight"}, user=owner)).answer()
            ((story_id,),) = await read_db(settings, select(Story.id))
            store.put(recap_key(store, story_id, [removed], 1000), b"a kept recap")
            own.stop()
            removal = await double.slash("admin reports remove", {"job": removed}, user=owner)
            removed_said = private_text(await removal.answer(timeout=60))
            purge = await double.slash("admin purge", {"user": double.player}, user=owner)
            purged_said = private_text(await purge.answer(timeout=60))
            await (await double.slash("story end", user=owner)).followups(timeout=60)  # its kept recap: owed
            owed_while_down = await count_rows(settings, ClipDelete)
            own.start()
            deadline = asyncio.get_running_loop().time() + 60
            while store.keys(f"{store.game}/") or await count_rows(settings, ClipDelete):
                assert asyncio.get_running_loop().time() < deadline, store.keys(f"{store.game}/")
                await asyncio.sleep(0.5)
    finally:
        own.stop()
    assert "deleted as soon as the clip store answers" in removed_said, removed_said
    assert "0 clip file(s). 1 more clip file(s) will be deleted as soon as the clip store answers" in purged_said
    assert owed_while_down == 3
