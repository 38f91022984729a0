"""Every hot query stays fast as the tables grow: with 100,000 jobs, none reads a whole table.

Hot: what runs for each command (/act's checks, /queue, /cancel, /history, the result buttons) and on
each tick of the supervisor and the delivery loop, and retention's batches. Each is run as the bot
runs it (the real function, in a transaction rolled back after), its SQL captured on its way to the
database, and every SELECT, UPDATE and DELETE it sent is explained there:

- the plan may not read a whole table: on SQLite no ``SCAN <table>`` (with or without an index: a
  SCAN walks all of it); on PostgreSQL, after ANALYZE and with sequential scans switched off (so a
  Seq Scan is what is left when no index can serve), no ``Seq Scan``;
- nor may its work grow with the table: an index can still walk most rows (``(status, id)`` walked
  every finished job for the delivery loop), so each statement also runs once with its work
  counted, SQLite's virtual-machine steps and the rows PostgreSQL's scans touched, against a bound far below what
  walking the 100,000 jobs costs (``WALK``, printed beside each measure).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, insert, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from db import jobs as j
from db import moderation as m
from db import queries as q
from db import retention as r
from db.base import utcnow
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import Character, Guild, GuildSettings, Player, Story, StoryMember
from tests.db.conftest import BACKENDS, Postgres, sqlite_url

JOBS = 100_000
GUILDS, PLAYERS, STORIES = 100, 2_000, 50
IN_FLIGHT = 40  # the newest jobs: 20 running, then 20 queued (the newest 10 not yet sent)
RECENT = 20_000  # the newest turns still hold a representation and a clip
TABLES = {"guilds", "guild_settings", "players", "characters", "stories", "story_members", "turns", "jobs"}

# Work bounds: a few percent of what one walk over the 100,000 jobs costs on each backend (WALK below).
VM_STEPS_BOUND = 20_000
ROWS_BOUND = 2_000


@dataclass(frozen=True)
class Filled:
    backend: str
    url: str
    guild: int  # a player's server, and the player (user id), their character, their story, ...
    user: int
    character: int
    story: int
    story_seq: int
    queued_job: int
    sent_job: int
    done_job: int


def _player_of(i: int) -> int:
    return i % PLAYERS + 1


def _guild_of(player: int) -> int:
    return player % GUILDS + 1


def _rows() -> tuple[list[dict], list[dict]]:
    now = utcnow()
    turns, jobs = [], []
    for i in range(1, JOBS + 1):
        player = _player_of(i)
        made = now - timedelta(seconds=30 * (JOBS - i))
        age = JOBS - i  # 0: the newest
        if age < IN_FLIGHT:
            status = "running" if age >= IN_FLIGHT // 2 else "queued"
        elif i % 20 == 0:
            status = "cancelled"
        elif i % 33 == 0:
            status = "failed"
        else:
            status = "done"
        done = status == "done"
        story = i % 10 == 0
        k = i // 10
        turns.append(
            {
                "id": i,
                "character_id": player,
                "story_id": k % STORIES + 1 if story else None,
                "seq": k // STORIES + 1 if story else None,
                "instruction": f"Character: C{player}; Motion: wave; Background: town.",
                "seed": i,
                "model": "toy",
                "model_key": "toy",
                **dict.fromkeys(("d_motion", "d_social", "d_entertainment", "d_stamina"), 0 if done else None),
                "stamina_after": 50 if done else None,
                "social_after": 50 if done else None,
                "entertainment_after": 50 if done else None,
                "representation": b"r" if done and age < RECENT else None,
                "clip_key": f"clips/job_{i}.mp4" if done and age < RECENT else None,
                "created_at": made,
            }
        )
        final = status in ("done", "failed", "cancelled")
        jobs.append(
            {
                "id": i,
                "turn_id": i,
                "task_id": f"task-{i}",
                "kind": "story" if story else "act",
                "status": status,
                "guild_id": _guild_of(player),
                "channel_id": _guild_of(player) * 1000,
                "user_id": player,
                "queued_at": made,
                "sent_at": None if age < IN_FLIGHT // 4 else made,
                "started_at": made + timedelta(seconds=2) if status != "queued" else None,
                "finished_at": made + timedelta(seconds=20) if final else None,
                "applied_at": made + timedelta(seconds=20) if done else None,
                # A few finished turns wait to be posted; a few cancelled ones for their workers to be told.
                "result_message_id": None if done and IN_FLIGHT <= age < IN_FLIGHT + 30 else (i if done else None),
                "cancel_marked_at": None
                if status == "cancelled" and age < 400
                else (made if status == "cancelled" else None),
                "deadline_at": made + timedelta(minutes=5) if not final else None,
            }
        )
    return turns, jobs


async def _fill(engine: AsyncEngine) -> None:
    turns, jobs = _rows()
    async with engine.begin() as conn:
        await conn.execute(insert(Guild), [{"id": g, "name": f"g{g}"} for g in range(1, GUILDS + 1)])
        await conn.execute(insert(GuildSettings), [{"guild_id": g} for g in range(1, GUILDS + 1)])
        await conn.execute(
            insert(Player), [{"id": p, "guild_id": _guild_of(p), "user_id": p} for p in range(1, PLAYERS + 1)]
        )
        await conn.execute(
            insert(Character),
            [{"id": p, "player_id": p, "name": f"C{p}", "is_active": True} for p in range(1, PLAYERS + 1)],
        )
        await conn.execute(
            insert(Story),
            [
                {
                    "id": s,
                    "guild_id": _guild_of(s),
                    "channel_id": s,
                    "title": f"s{s}",
                    "created_by": s,
                    "last_seq": JOBS,
                }
                for s in range(1, STORIES + 1)
            ],
        )
        await conn.execute(
            insert(StoryMember),
            [{"story_id": s, "character_id": p, "position": p} for s in range(1, STORIES + 1) for p in range(1, 11)],
        )
        await _bulk(conn, "turns", turns)
        await _bulk(conn, "jobs", jobs)
        if engine.dialect.name == "postgresql":  # explicit ids: move the sequences past them
            for table in ("guilds", "players", "characters", "stories", "story_members", "turns", "jobs"):
                await conn.execute(
                    text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
                )
    if engine.dialect.name == "postgresql":
        # Statistics as autovacuum keeps them. Not on SQLite: the bot's database never runs ANALYZE, and
        # this build's statistics (no STAT4) are averages that hide how few jobs are in flight.
        async with engine.connect() as conn:
            await conn.execute(text("ANALYZE"))
            await conn.commit()


async def _bulk(conn: AsyncConnection, table: str, rows: list[dict]) -> None:
    """Insert through the driver's own bulk path (COPY on PostgreSQL): the ORM's way took 10 s here."""
    columns = list(rows[0])
    driver = (await conn.get_raw_connection()).driver_connection
    if conn.dialect.name == "postgresql":
        await driver.copy_records_to_table(table, records=[tuple(r[c] for c in columns) for r in rows], columns=columns)
        return
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    await driver.executemany(sql, [tuple(_sqlite(r[c]) for c in columns) for r in rows])


def _sqlite(value: object) -> object:
    # UtcDateTime's storage on SQLite: UTC, as SQLAlchemy writes a DATETIME.
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", timespec="microseconds")
    return value


@pytest.fixture(scope="module", params=BACKENDS)
def filled(
    request: pytest.FixtureRequest, postgres: Postgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Filled]:
    import asyncio

    backend = request.param
    name = None
    if backend == "sqlite":
        url = sqlite_url(tmp_path_factory.mktemp("plans") / "game.db")
    else:
        if (reason := postgres.unavailable()) is not None:
            pytest.skip(reason)
        name = postgres.new_database()
        url = postgres.url_for(name)
    upgrade(url)

    async def fill() -> None:
        engine = make_engine(url)
        try:
            await _fill(engine)
        finally:
            await engine.dispose()

    asyncio.run(fill())
    player = _player_of(JOBS)  # the newest job's player: a turn in flight
    yield Filled(
        backend=backend,
        url=url,
        guild=_guild_of(player),
        user=player,
        character=player,
        story=(JOBS // 10 - 1) % STORIES + 1,  # a story whose newest turns were made (every 20th job is cancelled)
        story_seq=(JOBS // 10 - 1) // STORIES + 1,
        queued_job=JOBS,
        sent_job=JOBS - IN_FLIGHT // 2 + 1,
        done_job=JOBS - IN_FLIGHT - 50,
    )
    if name is not None:
        postgres.drop(name)


@pytest.fixture
async def engine(filled: Filled) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(filled.url)
    yield engine
    await engine.dispose()


# --------------------------------------------------------------------------------------------
# The hot queries: each as the bot calls it
# --------------------------------------------------------------------------------------------

Call = Callable[[AsyncSession, Filled], Awaitable[object]]


async def _story(s: AsyncSession, f: Filled) -> Story:
    return await s.get_one(Story, f.story)


async def _character(s: AsyncSession, f: Filled) -> Character:
    return await s.get_one(Character, f.character)


async def _create_turn(s: AsyncSession, f: Filled) -> object:
    other = f.user + 100  # a player with no turn in flight, in the story: its seq is bumped
    line = "Character: C; Motion: wave; Background: town."
    return await j.create_turn(s, other, line, 1, "toy", story=f.story, guild_id=_guild_of(other), user_id=other)


HOT: dict[str, Call] = {
    # /act, /story act, Reroll, Continue: bot.turns.submit_turn's checks, cheapest first
    "find_ban": lambda s, f: m.find_ban(s, f.guild, f.user),
    "channel_allowed": lambda s, f: m.channel_allowed(s, f.guild, 1),
    "get_guild_settings": lambda s, f: q.get_guild_settings(s, f.guild),
    "active_character": lambda s, f: q.active_character(s, f.guild, f.user),
    "find_blocked_term": lambda s, f: m.find_blocked_term(s, f.guild, "wave town"),
    "hold_guild": lambda s, f: m.hold_guild(s, f.guild),
    "player_has_turn_in_flight": lambda s, f: j.player_has_turn_in_flight(s, f.guild, f.user),
    "turns_in_last_hour": lambda s, f: m.turns_in_last_hour(s, f.guild, f.user),
    "queued_in_guild": lambda s, f: m.queued_in_guild(s, f.guild),
    "member_of_story": lambda s, f: q.member_of_story(s, f.story, f.character),
    "next_in_turn": lambda s, f: _next_in_turn(s, f),
    "average_turn_seconds": lambda s, f: j.average_turn_seconds(s, 60.0),
    "seconds_between_turns": lambda s, f: j.seconds_between_turns(s, 60.0),
    "create_turn": _create_turn,
    "queue_position_unsent": lambda s, f: j.queue_position(s, f.queued_job),
    "queue_position_sent": lambda s, f: j.queue_position(s, f.sent_job),
    # each supervisor tick
    "jobs_to_send": lambda s, f: j.jobs_to_send(s),
    "cancels_to_mark": lambda s, f: j.cancels_to_mark(s),
    "jobs_in_flight": lambda s, f: j.jobs_in_flight(s),
    "get_job": lambda s, f: j.get_job(s, f.sent_job),
    "beat": lambda s, f: j.beat(s, f.sent_job, utcnow()),
    "apply_result_claim": lambda s, f: j.fail_job(s, f.sent_job, "x"),
    "history_of_character": lambda s, f: _history(s, f, story=False),
    "history_of_story": lambda s, f: _history(s, f, story=True),
    # each delivery tick, and each post
    "jobs_to_post": lambda s, f: j.jobs_to_post(s),
    "earlier_story_turns_unposted": lambda s, f: j.earlier_story_turns_unposted(s, f.story, f.story_seq),
    "turn_of_job": lambda s, f: j.turn_of_job(s, f.done_job),
    # /queue, /cancel, /start, /reset, /history
    "user_jobs_in_flight": lambda s, f: j.user_jobs_in_flight(s, f.guild, f.user),
    "has_turn_in_flight": lambda s, f: j.has_turn_in_flight(s, f.character),
    "recent_turns": lambda s, f: q.recent_turns(s, f.character),
    # retention, one batch of each kind (its work grows with the batch, never with the table)
    "retention_representations": lambda s, f: r.prune_batch(s, r.Kept.REPRESENTATIONS, _days_ago(3), size=100),
    "retention_clips": lambda s, f: r.prune_batch(s, r.Kept.CLIPS, _days_ago(3), size=100),
}


def _days_ago(days: int) -> datetime:
    return utcnow() - timedelta(days=days)


async def _history(s: AsyncSession, f: Filled, *, story: bool) -> object:
    source = await _story(s, f) if story else await _character(s, f)
    return await j.build_history(s, source, 5, "toy")


async def _next_in_turn(s: AsyncSession, f: Filled) -> object:
    return await q.next_in_turn(s, await _story(s, f))


# --------------------------------------------------------------------------------------------


async def _captured(engine: AsyncEngine, call: Call, f: Filled) -> list[tuple[str, Any]]:
    """The statements ``call`` sends (reads, updates, deletes), with their parameters; its changes rolled back."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        sent.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        async with make_sessionmaker(engine)() as session:
            await call(session, f)
            await session.rollback()
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
    return [
        (sql, params)
        for sql, params in sent
        if sql.lstrip().split(None, 1)[0].upper() in ("SELECT", "UPDATE", "DELETE")
    ]


async def _sqlite_plan(conn: AsyncConnection, sql: str, params: Any) -> list[str]:
    rows = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)).all()
    return [row[-1] for row in rows]


def _sqlite_scans(plan: list[str]) -> list[str]:
    return [step for step in plan if step.startswith("SCAN ") and step.split()[1] in TABLES]


async def _sqlite_work(conn: AsyncConnection, sql: str, params: Any) -> int:
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    steps = [0]

    def count() -> int:
        steps[0] += 1000
        return 0

    await driver.set_progress_handler(count, 1000)
    try:
        result = await conn.exec_driver_sql(sql, params)
        if result.returns_rows:
            result.all()
    finally:
        await driver.set_progress_handler(None, 1000)
    return steps[0]


async def _postgres_plan(conn: AsyncConnection, sql: str, params: Any) -> dict:
    await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
    plan = (await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}", params)).scalar_one()
    await conn.exec_driver_sql("SET LOCAL enable_seqscan = on")
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _postgres_steps(plan: dict) -> list[str]:
    return [
        " ".join(str(n[k]) for k in ("Node Type", "Index Name", "Relation Name", "Index Cond") if k in n)
        for n in _nodes(plan)
    ]


def _postgres_scans(plan: dict) -> list[str]:
    return [
        f"Seq Scan on {n['Relation Name']}"
        for n in _nodes(plan)
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in TABLES
    ]


async def _postgres_work(conn: AsyncConnection, sql: str, params: Any) -> int:
    """Rows the statement touched: each node's rows out plus those it read and dropped, times its loops."""
    result = (await conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)).scalar_one()
    plan = (json.loads(result) if isinstance(result, str) else result)[0]["Plan"]
    return round(
        sum(
            (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Index Recheck", 0))
            * n.get("Actual Loops", 1)
            for n in _nodes(plan)
            if "Scan" in n["Node Type"]
        )
    )


@pytest.mark.parametrize("name", list(HOT))
async def test_a_hot_query_reads_no_whole_table_and_its_work_does_not_grow_with_it(
    filled: Filled, engine: AsyncEngine, name: str
) -> None:
    statements = await _captured(engine, HOT[name], filled)
    assert statements, f"{name} sent no query"
    for sql, params in statements:
        async with engine.connect() as conn:
            if filled.backend == "sqlite":
                plan = await _sqlite_plan(conn, sql, params)
                scans, work, bound = _sqlite_scans(plan), await _sqlite_work(conn, sql, params), VM_STEPS_BOUND
            else:
                tree = await _postgres_plan(conn, sql, params)
                plan, scans = _postgres_steps(tree), _postgres_scans(tree)
                work, bound = await _postgres_work(conn, sql, params), ROWS_BOUND
            await conn.rollback()
        print(f"{filled.backend} {name}: work {work} (bound {bound}) {' | '.join(plan)[:300]}")
        assert scans == [], f"{name} reads a whole table: {scans}\n{sql}\nplan: {plan}"
        assert work <= bound, (
            f"{name} does {work} units of work (bound {bound}): it grows with the table\n{sql}\nplan: {plan}"
        )


async def test_the_bounds_are_far_below_one_walk_over_the_jobs(filled: Filled, engine: AsyncEngine) -> None:
    """What the bounds are measured against: counting every job (a whole walk) costs far more than any bound."""
    sql, params = "SELECT count(*) FROM jobs WHERE error IS NULL", ()
    async with engine.connect() as conn:
        if filled.backend == "sqlite":
            work, bound = await _sqlite_work(conn, sql, params), VM_STEPS_BOUND
        else:
            work, bound = await _postgres_work(conn, sql, params), ROWS_BOUND
    print(f"{filled.backend} WALK: {work} (bound {bound}, {work / bound:.0f}x)")
    assert work >= 20 * bound
