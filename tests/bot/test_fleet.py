"""Two bot processes, one game: on one PostgreSQL, one Redis and one S3 store (SeaweedFS), each in a folder of its
own with no folder in common, one worker, every turn is posted exactly once with its clip whichever process applies
its result and whichever posts it.

With clips in each process's own folder a process could post a turn another applied, finding no clip, and
Discord's nonce then folded the other's post (with the clip) into that one: a turn posted once, without its clip
(1 run in 2 of the first test here, before clips were shared).

Both processes connect the same shard, as during a rolling deploy: the loopback Discord hands each interaction to
the newer live session, and both run every background duty, the outbox only while holding its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from db.migrate import upgrade
from db.models import JobStatus
from tests.bot.test_story_votes import ALICE, PROPOSALS, VOTERS, propose, round_message, start_vote_story, vote
from tests.crowd import CLIP, BotProcess, bot_argv, burst, crowd, discord_env, late, read_jobs, settle, setup_servers
from tests.db.conftest import POSTGRES_URL, Postgres
from tests.discord_double import DiscordDouble, Guild, shard_for
from tests.s3_server import S3Server
from tests.workers import REPO, Worker, machine, start_worker, worker_env

pytestmark = pytest.mark.slow  # two bot processes, a worker, PostgreSQL and Redis

PLAYERS = 6


@contextlib.contextmanager
def database_at(revision: str) -> Iterator[str]:
    """A PostgreSQL database of its own, migrated to ``revision``."""
    server = Postgres(POSTGRES_URL)
    if reason := server.unavailable():
        pytest.skip(reason)
    name = server.new_database()
    upgrade(server.url_for(name), revision)
    try:
        yield server.url_for(name)
    finally:
        server.drop(name)


@pytest.fixture
def fleet_database() -> Iterator[str]:
    with database_at("head") as url:  # as the operator does (`animegamer db upgrade`) before starting the bots
        yield url


def clip_messages(double: DiscordDouble) -> dict[int, int]:
    """Job id -> how many messages in the channels carry its clip (a post Discord deduplicated by its nonce is one)."""
    seen: dict[int, int] = {}
    for message in double.messages():
        for attachment in message.attachments:
            found = CLIP.fullmatch(attachment["filename"])
            if found:
                seen[int(found[1])] = seen.get(int(found[1]), 0) + 1
    return seen


def clip_posts_made(double: DiscordDouble, answered: bool = False) -> dict[int, int]:
    """Job id -> how many create-message calls carried its clip: every call a process made (``answered``: every call
    Discord answered with the message, leaving out the ones a fault refused), before Discord's nonce folds a repeat
    into the first message."""
    made: dict[int, int] = {}
    for call in double.calls_to("POST", r"/channels/\d+/messages"):
        if answered and call.status != 200:
            continue
        for upload in call.files:
            found = CLIP.fullmatch(upload.filename)
            if found:
                made[int(found[1])] = made.get(int(found[1]), 0) + 1
    return made


@contextlib.asynccontextmanager
async def fleet(
    tmp_path: Path,
    redis_url: str,
    database: str,
    guilds: list,
    names: tuple[str, ...] = ("old", "new"),
    shard_ids: tuple[str, ...] | None = None,
    extra_env: dict[str, str] | None = None,
    together: bool = False,
    store: S3Server | None = None,
    clocks: dict[str, str] | None = None,
    discord_host: dict[str, str] | None = None,
    faulty_worker: dict[str, str] | None = None,
    bot_env: dict[str, dict[str, str]] | None = None,
    worker: Worker | None = None,
) -> AsyncIterator[tuple[DiscordDouble, list[BotProcess]]]:
    """A worker in a folder of its own and bots, each in one of its own with no folder in common, on ``database``,
    Redis and an S3 store (SeaweedFS) that keeps the clips. By default all on the one shard of one loopback Discord,
    started one after another, the newest taking the interactions (a rolling deploy); with ``shard_ids`` each bot
    connects only its own shards of ``len(shard_ids)`` (SHARD_COUNT, SHARD_IDS); ``together`` starts them at once.
    ``store``: one the test started (and stops), to look into. ``clocks``: a bot's wall clock (or the worker's,
    ``"worker"``) shifted by libfaketime (``{"new": "+90s"}``); its monotonic clock is left alone, as NTP leaves it.
    ``discord_host``: the name a bot reaches Discord by (``localhost``, so that a fault takes its requests alone).
    ``faulty_worker``: the worker's settings, and it runs ``tests.faulty_worker`` (turns that misbehave on request).
    ``bot_env``: settings of one bot alone, by its name. ``worker``: one already running on ``redis_url`` (a file's
    ``fleet_worker``), left running; else one of the test's own, stopped with it."""
    faketime = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)
    if clocks and faketime is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime; .ci/run installs it)")
    own_store = store is None
    store = store or S3Server(tmp_path / "seaweedfs")

    def shifted(name: str) -> dict[str, str]:  # preloaded into that process alone, which the test then stops
        if not clocks or name not in clocks:
            return {}
        return {"LD_PRELOAD": str(faketime), "FAKETIME": clocks[name], "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    own_worker = worker is None
    gpu = tmp_path / "gpu-machine"
    env_of_worker = {**worker_env(gpu / "data", redis_url, **(faulty_worker or {})), **machine(gpu)}
    env_of_worker.update(shifted("worker"))
    # The faulty worker runs from the repository, where its module is.
    module, cwd = ("animegamer", gpu) if faulty_worker is None else ("tests.faulty_worker", REPO)
    bots: list[BotProcess] = []
    try:
        # The store and the worker start together: each is seconds of waiting on a process of its own.
        outcomes = await asyncio.gather(
            asyncio.to_thread(store.start) if own_store else asyncio.sleep(0),
            asyncio.to_thread(start_worker, env_of_worker, module, cwd) if own_worker else asyncio.sleep(0, worker),
            return_exceptions=True,
        )
        worker = outcomes[1] if isinstance(outcomes[1], Worker) else None
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        async with DiscordDouble(guilds, strict=True) as double:
            env = {
                **{
                    k: v
                    for k, v in worker.env.items()
                    if not k.startswith(("ANIMEGAMER_", "HOME", "TMPDIR", "LD_PRELOAD", "FAKETIME"))
                },
                **discord_env(double),
                "ANIMEGAMER_BROKER_URL": redis_url,
                "ANIMEGAMER_RESULT_BACKEND": redis_url,
                "ANIMEGAMER_DATABASE_URL": database,
                "ANIMEGAMER_QUEUE": worker.env["ANIMEGAMER_QUEUE"],
                "ANIMEGAMER_MODEL": "tiny",
                "ANIMEGAMER_DELIVERY_POLL_SECONDS": "0.2",
                "ANIMEGAMER_CLIP_STORE": f"s3://{store.bucket}/fleet",
                "AWS_ENDPOINT_URL": store.endpoint,
                "AWS_ACCESS_KEY_ID": store.access_key,
                "AWS_SECRET_ACCESS_KEY": store.secret_key,
                **(extra_env or {}),
            }
            for i, name in enumerate(names):
                folder = tmp_path / f"{name}-bot"
                shards = {"SHARD_COUNT": str(len(shard_ids)), "SHARD_IDS": shard_ids[i]} if shard_ids else {}
                env_of = {**env, **shards, **shifted(name), **machine(folder), **(bot_env or {}).get(name, {})}
                if discord_host and name in discord_host:
                    env_of["DISCORD_API_BASE"] = double.api_base_for(discord_host[name])
                bot = BotProcess(bot_argv(), env_of, folder / "bot.log", cwd=folder)
                bots.append(bot.start())
                if not together:  # a rolling deploy: the new bot is ready before the old one stops
                    await bot.ready(double, ("act", "start", "admin"))
            await asyncio.gather(*(bot.ready(double, ("act", "start", "admin")) for bot in bots))
            yield double, bots
    finally:
        for bot in bots:
            bot.stop()
        if own_worker and worker is not None:
            worker.kill()
        if own_store:
            store.stop()


def logs(bots: list[BotProcess], jobs: list | None = None) -> str:
    """The tail of each bot's log; with ``jobs`` (rows of read_jobs), each job's row and every line about it."""
    tails = "\n".join(bot.log.read_text(errors="replace")[-2000:] for bot in bots)
    if not jobs:
        return tails
    told = [line for bot in bots for line in bot.log.read_text(errors="replace").splitlines()]
    about = [f"{row}: " + " | ".join(line for line in told if f"job {row[0]} " in line) for row in jobs]
    return "\n".join(about) + "\n" + tails


async def test_two_bot_processes_on_one_database_post_every_turn_exactly_once(
    redis_url: str, tmp_path: Path, fleet_database: str, fleet_worker: Worker
) -> None:
    guilds, players = crowd(PLAYERS, guilds=2)
    async with fleet(tmp_path, redis_url, fleet_database, guilds, worker=fleet_worker) as (double, bots):
        await setup_servers(double, guilds, players)
        handles = await burst(double, players)
        jobs = await settle(double, fleet_database, handles, timeout=180)
    posted, made = clip_messages(double), clip_posts_made(double)
    print(f"two processes, every shard each: {sum(made.values())} create-message calls for {len(jobs)} turns")
    assert late(handles) == 0 and len(jobs) == PLAYERS, logs(bots)
    assert sorted(posted) == sorted(job_id for job_id, *_ in jobs), logs(bots)  # none lost
    assert set(posted.values()) == {1}, (posted, logs(bots))  # none twice


async def kill_the_busiest_with_its_posts_unsent(
    double: DiscordDouble, bots: list[BotProcess], database: str, guilds: list, players: list
) -> tuple[list[int], list]:
    """Discord holds every post (429s) while the bots apply a burst's results; the one that applied the most is
    killed (SIGKILL), then Discord lets posts through. Returns each bot's count of results applied, and the jobs."""
    await setup_servers(double, guilds, players)
    double.fail("POST", r"/channels/\d+/messages", status=429, retry_after=2, times=None)
    handles = await burst(double, players)
    await until_all_applied(database, len(players))
    applied = [bot.log.read_text(errors="replace").count(" done in ") for bot in bots]
    victim = bots[applied.index(max(applied))]
    assert victim.proc is not None
    victim.proc.kill()
    victim.proc.wait(10)
    double.clear_faults()
    return applied, await settle(double, database, handles, timeout=120)


async def test_with_no_folder_in_common_a_killed_bots_turns_are_posted_by_the_other_with_their_clips(
    redis_url: str, tmp_path: Path, fleet_database: str, fleet_worker: Worker
) -> None:
    """The bot that applied the most results is killed with its posts unsent, and the other posts every turn with
    the clip it reads from the store."""
    guilds, players = crowd(4, guilds=2)
    async with fleet(tmp_path, redis_url, fleet_database, guilds, worker=fleet_worker) as (double, bots):
        applied, jobs = await kill_the_busiest_with_its_posts_unsent(double, bots, fleet_database, guilds, players)
    posted = clip_messages(double)
    assert max(applied) >= 1 and sum(applied) == len(players), (applied, logs(bots))
    assert sorted(posted) == sorted(job_id for job_id, *_ in jobs), logs(bots)  # none lost, none without its clip
    assert set(posted.values()) == {1}, (posted, logs(bots))  # none twice
    sizes = [len(f.data) for m in double.messages() for f in m.files.values() if f.filename.endswith(".mp4")]
    assert len(sizes) == len(players) and min(sizes) > 1000  # real MP4s, read back from the store
    kept = [path for name in ("old", "new") for path in (tmp_path / f"{name}-bot").rglob("*.mp4")]
    assert kept == []  # no clip in either bot's folder


async def until_all_applied(database: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = await read_jobs(database)
        if len(jobs) == count and all(status is JobStatus.DONE for _, status, *_ in jobs):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not every result was applied within {timeout:.0f} s: {await read_jobs(database)}")


async def test_a_vote_round_under_two_bot_processes_is_shown_once_and_its_winner_played_once(
    redis_url: str, tmp_path: Path, fleet_database: str, fleet_worker: Worker
) -> None:
    """Discord takes 1.5 s to make each channel message, so both processes' round loops (a tick a second) find the
    new round without its message, and the closed one unannounced: without the nonces they post each twice."""
    async with fleet(tmp_path, redis_url, fleet_database, [Guild()], worker=fleet_worker) as (double, bots):
        await start_vote_story(double)
        double.fail("POST", r"/channels/\d+/messages", status=0, delay=1.5, times=None)  # a slow Discord
        for player, *_ in PROPOSALS:
            assert "Proposed for round 1" in await propose(double, player)
        message = await round_message(double, proposals=3)
        for voter in VOTERS[:3]:
            await vote(double, message, 1, voter)
        await (await double.slash("story close", user=ALICE)).answer()
        await double.wait_until(lambda: clip_messages(double), timeout=90, what="the winner's clip")
        await asyncio.sleep(3)  # more ticks of both loops: nothing more may be shown or played
    rounds = [m for m in double.messages(double.guild.channel.id) if m.content.startswith("🗳️")]
    queued = [m for m in double.messages(double.guild.channel.id) if m.content.startswith("🎬")]  # its progress
    assert (len(rounds), len(queued)) == (1, 1), ([m.content[:80] for m in rounds], logs(bots))
    assert list(clip_messages(double).values()) == [1], logs(bots)
    jobs = await read_jobs(fleet_database)
    assert len(jobs) == 1, jobs  # the winner's turn, made once


async def test_two_processes_on_shard_ranges_of_their_own_each_serve_their_servers(
    redis_url: str, tmp_path: Path, fleet_database: str, fleet_worker: Worker
) -> None:
    """SHARD_COUNT=2, one process with SHARD_IDS=0 and one with 1: each connects only its shard, and every turn of
    both servers (one on each shard) is posted once with its clip."""
    guilds, players = crowd(4, guilds=2)
    assert {shard_for(guild.id, 2) for guild in guilds} == {0, 1}
    shards = ("0", "1")
    async with fleet(tmp_path, redis_url, fleet_database, guilds, shard_ids=shards, worker=fleet_worker) as (
        double,
        bots,
    ):
        sessions = sorted((session.shard_id, session.shard_count) for session in double.sessions.values())
        await setup_servers(double, guilds, players)
        handles = await burst(double, players)
        jobs = await settle(double, fleet_database, handles, timeout=180)
    posted, made = clip_messages(double), clip_posts_made(double)
    connected = [bot.log.read_text(errors="replace") for bot in bots]
    print(f"two processes, a shard each: {sum(made.values())} create-message calls for {len(jobs)} turns")
    assert sessions == [(0, 2), (1, 2)], sessions  # one session a shard: neither process connected the other's
    assert "shards [0] of 2" in connected[0] and "shards [1] of 2" in connected[1], logs(bots)
    assert late(handles) == 0 and len(jobs) == len(players), logs(bots)
    assert sorted(posted) == sorted(job_id for job_id, *_ in jobs), logs(bots)  # none lost
    assert set(posted.values()) == {1} and set(made.values()) == {1}, (posted, made, logs(bots))  # none twice
    for job_id, _, _, guild_id, _ in jobs:  # each posted by the process of its server's shard
        assert f"job {job_id} posted as message" in connected[shard_for(guild_id, 2)], logs(bots)
