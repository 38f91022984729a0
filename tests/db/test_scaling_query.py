"""The query KEDA scales the GPU workers on (deploy/kubernetes/base/worker-scaling.yaml), run on a real PostgreSQL
as turns are queued, sent, started and finished: the replica count it asks for at each step, as KEDA computes it
(ceil(value / targetQueryValue) within the replica bounds, zero at or under the activation value)."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from db import jobs as j
from db import queries as q
from db.base import utcnow

SCALING = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base" / "worker-scaling.yaml"
SCALED = next(doc for doc in yaml.safe_load_all(SCALING.read_text()) if doc["kind"] == "ScaledObject")
TRIGGER = SCALED["spec"]["triggers"][0]["metadata"]
GUILD = 1_000_000_000_000_000_001
SOON = timedelta(minutes=5)
Sessions = async_sessionmaker[AsyncSession]

pytestmark = [pytest.mark.parametrize("backend", ["postgresql"], indirect=True), pytest.mark.slow]  # KEDA's database


async def asked(sessions: Sessions) -> int:
    """The replicas KEDA asks for, from the query's value now."""
    async with sessions() as s:
        value = float(await s.scalar(text(TRIGGER["query"])))
    if value <= float(TRIGGER["activationTargetQueryValue"]):
        return SCALED["spec"]["minReplicaCount"]
    wanted = math.ceil(value / float(TRIGGER["targetQueryValue"]))
    return min(SCALED["spec"]["maxReplicaCount"], max(1, wanted))


async def queue_turns(sessions: Sessions, players: range, story: int | None = None) -> list[int]:
    made = []
    async with sessions() as s, s.begin():
        for user in players:
            character = await q.get_or_create_character(s, GUILD, user, "Qiqi")
            line = "Character: Qiqi; Motion: wave; Background: town."
            made.append((await j.create_turn(s, character, line, 1, "tiny", story=story, user_id=user))[1].id)
    return made


async def move(sessions: Sessions, *steps) -> None:
    async with sessions() as s, s.begin():
        for step in steps:
            assert await step(s)


async def test_the_scaling_query_asks_for_a_worker_per_turn_in_flight_and_for_none_when_idle(sessions) -> None:
    seen = {"idle": await asked(sessions)}
    first = await queue_turns(sessions, range(1, 4))  # queued, not yet sent: the outbox waits for a worker
    seen["3 queued, unsent"] = await asked(sessions)
    await move(sessions, *(lambda s, i=i: j.mark_sent(s, i, utcnow() + SOON) for i in first))
    await move(sessions, *(lambda s, i=i: j.mark_started(s, i, utcnow() + SOON) for i in first[:2]))
    seen["2 running, 1 sent"] = await asked(sessions)
    await move(sessions, lambda s: j.fail_job(s, first[0], "boom"), lambda s: j.cancel_job(s, first[1]))
    seen["1 left"] = await asked(sessions)
    burst = await queue_turns(sessions, range(10, 60))  # a burst of 50
    seen["a burst of 50"] = await asked(sessions)
    await move(sessions, lambda s: j.cancel_job(s, first[2]), *(lambda s, i=i: j.cancel_job(s, i) for i in burst))
    seen["all ended"] = await asked(sessions)
    top = SCALED["spec"]["maxReplicaCount"]
    assert seen == {
        "idle": 0,
        "3 queued, unsent": 3,
        "2 running, 1 sent": 3,
        "1 left": 1,
        "a burst of 50": top,
        "all ended": 0,
    }


async def test_a_storys_turns_count_as_one_worker_since_they_run_one_after_another(sessions) -> None:
    async with sessions() as s, s.begin():
        story = (await q.create_story(s, GUILD, 77, "Night flight", 1)).id
    await queue_turns(sessions, range(1, 5), story=story)
    assert await asked(sessions) == 1
    await queue_turns(sessions, range(5, 7))
    assert await asked(sessions) == 3
