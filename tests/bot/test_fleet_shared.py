"""What two bot processes of one game share beyond the database: recaps kept in the object store (made by one,
reused and deleted by the other) and the schema (migrated once when both start together on an older one).

Split from test_fleet.py (its helpers live there) so that the fleet's tests run in parallel, a file a test process.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from db.migrate import current_revision, head_revision
from tests.bot.helpers import accepted, private_text
from tests.bot.test_fleet import clip_messages, database_at, fleet, fleet_database, logs
from tests.bot.test_story import PLAYERS as PLAYERS_IN_STORY
from tests.bot.test_story import begin_story
from tests.crowd import BotProcess, bot_argv, burst, crowd, discord_env, late, settle, setup_servers
from tests.discord_double import DiscordDouble, Guild
from tests.s3_server import S3Server
from tests.workers import Worker, machine

pytestmark = pytest.mark.slow  # two bot processes, a worker, PostgreSQL, Redis and SeaweedFS

__all__ = ["fleet_database"]  # the fixture, used here by name


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "seaweedfs")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def recaps_in(store: S3Server) -> list[str]:
    """The kept recaps under the fleet's prefix (``fleet/<game>/recaps/...``)."""
    listed = store.client().list_objects_v2(Bucket=store.bucket, Prefix="fleet/")
    return [item["Key"] for item in listed.get("Contents", []) if "/recaps/" in item["Key"]]


async def test_a_recap_made_by_one_process_is_reused_and_its_cooldown_kept_by_the_other(
    redis_url: str, tmp_path: Path, fleet_database: str, s3: S3Server, fleet_worker: Worker
) -> None:
    """The new bot makes the recap into the store and is then killed; the old one, taking the interactions now,
    refuses a recap within the cooldown the new one started, and /story end in it deletes the recap the other
    made."""
    async with fleet(tmp_path, redis_url, fleet_database, [Guild()], store=s3, worker=fleet_worker) as (double, bots):
        await begin_story(double)
        wave = {"motion": "gently wave", "background": "town"}
        await accepted(await double.slash("story act", wave, user=PLAYERS_IN_STORY[0]))
        await double.wait_until(lambda: clip_messages(double), timeout=90, what="the story turn's clip")
        (made,) = await (await double.slash("story recap", user=PLAYERS_IN_STORY[1])).followups(timeout=60)
        kept = recaps_in(s3)
        new = bots[1]
        assert new.proc is not None
        new.proc.kill()
        new.proc.wait(10)
        for _ in range(100):  # the double notices the closed socket without a call or frame to wake a wait_until
            if double.shards[0].ws is None:
                break
            await asyncio.sleep(0.1)
        refused = private_text(await (await double.slash("story recap", user=PLAYERS_IN_STORY[2])).answer())
        await (await double.slash("story end", user=PLAYERS_IN_STORY[0])).answer()
        left = recaps_in(s3)
    assert [f.filename for f in made.files] == ["story_1.mp4"] and len(kept) == 1, logs(bots)
    assert "had a recap just now" in refused, refused
    assert left == [], left


@pytest.fixture
def older_database() -> Iterator[str]:
    """A PostgreSQL database one revision behind the code, as before a deploy that brings a migration."""
    with database_at("0007") as url:
        yield url


async def test_two_bots_started_together_on_an_older_schema_migrate_it_once_and_both_play(
    redis_url: str, tmp_path: Path, older_database: str, fleet_worker: Worker
) -> None:
    """ANIMEGAMER_MIGRATE_AT_START=always on both: the advisory lock lets one upgrade while the other waits and
    then finds the schema current; both then take turns."""
    guilds, players = crowd(4, guilds=2)
    always = {"ANIMEGAMER_MIGRATE_AT_START": "always"}
    async with fleet(
        tmp_path,
        redis_url,
        older_database,
        guilds,
        shard_ids=("0", "1"),
        extra_env=always,
        together=True,
        worker=fleet_worker,
    ) as (double, bots):
        revision = await current_revision(older_database)
        await setup_servers(double, guilds, players)
        handles = await burst(double, players)
        jobs = await settle(double, older_database, handles, timeout=180)
    migrated = [bot.log.read_text(errors="replace").count("Running upgrade 0007 -> 0008") for bot in bots]
    assert revision == head_revision()
    assert sorted(migrated) == [0, 1], (migrated, logs(bots))
    assert late(handles) == 0 and len(jobs) == len(players), logs(bots)
    assert set(clip_messages(double).values()) == {1}, logs(bots)


async def test_a_bot_whose_clip_folder_is_not_the_running_ones_refuses_to_start_naming_the_setting(
    tmp_path: Path,
) -> None:
    """Two bot processes of one game (one database), each in a folder of its own with no ANIMEGAMER_CLIP_STORE: a
    turn one applied and the other posted went out without its clip (3 of 6 measured from outside). The second
    refuses to start, in one line naming the setting and its folder; the first plays on."""
    database = f"sqlite+aiosqlite:///{tmp_path / 'game.db'}"
    async with DiscordDouble([Guild()], strict=True) as double:

        def bot_in(name: str) -> BotProcess:
            folder = tmp_path / name
            env = {**os.environ, **discord_env(double), **machine(folder), "ANIMEGAMER_MODEL": "tiny", **QUICK_HOLD}
            env = {k: v for k, v in env.items() if not k.startswith("ANIMEGAMER_") or k in ANIMEGAMER_OF_A_BOT}
            return BotProcess(bot_argv(), {**env, "ANIMEGAMER_DATABASE_URL": database}, folder / "bot.log", folder)

        first = bot_in("first").start()
        try:
            await first.ready(double)
            second = bot_in("second").start()
            assert second.proc is not None
            code = await asyncio.to_thread(second.proc.wait, 60)
            still = first.proc is not None and first.proc.poll() is None
        finally:
            first.stop()
    said = second.log.read_text(errors="replace").strip().splitlines()[-1]
    assert code == 1 and still, second.log.read_text(errors="replace")[-2000:]
    assert said.startswith("ANIMEGAMER_CLIP_STORE is not set") and str(tmp_path / "second") in said, said


# A 6 s duty hold (and a Discord timeout within half of it): the second bot asks again after one hold.
QUICK_HOLD = {"ANIMEGAMER_DUTY_SECONDS": "6", "ANIMEGAMER_DISCORD_TIMEOUT": "3"}
ANIMEGAMER_OF_A_BOT = {"ANIMEGAMER_DATA_DIR", "ANIMEGAMER_MODEL", *QUICK_HOLD}
