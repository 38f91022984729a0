"""A result belongs to its turn (game/proof.py), tried with a rogue: a client holding the workers' Redis credentials
writes a result for another player's turn while that turn runs. The bot posts nothing of it, counts it, and the turn
still ends with its own clip, posted once."""

from __future__ import annotations

import asyncio
import json
import signal

import numpy as np
import pytest
import redis
from sqlalchemy import select

from db.models import Job, JobStatus
from media.mp4 import encode_mp4
from tests.bot.conftest import running_bot, settings_beside, wait_for_db
from tests.bot.helpers import accepted
from tests.bot.test_faults import SLOW, clip_posts, faulty_worker, start
from tests.discord_double import member
from tests.results import report, turn_result

pytestmark = pytest.mark.slow

BOB = member("bob")


async def bobs_turn_running(double, settings) -> tuple[int, str]:
    """Bob's slow turn, taken and running on a worker: its job id and task id."""
    await start(double, BOB)
    await accepted(await double.slash("act", SLOW, user=BOB))
    ((job_id, task_id, _),) = await wait_for_db(
        settings,
        select(Job.id, Job.task_id, Job.status),
        lambda rows: rows and rows[0][2] == JobStatus.RUNNING,
        60,
    )
    return job_id, task_id


async def bobs_turn_posted(settings, bot) -> tuple[list, float]:
    """Bob's job once posted (status, message, attempts), and how many results the bot rejected."""
    rows = await wait_for_db(
        settings, select(Job.status, Job.result_message_id, Job.attempts), lambda rows: rows[0][1] is not None, 180
    )
    return rows, bot.metrics.results_rejected._value.get()


def posted_clips(double) -> list[bytes]:
    return [f.data for call in clip_posts(double) for f in call.files if f.filename.endswith(".mp4")]


async def test_a_result_written_for_another_players_turn_is_rejected_and_the_turn_posts_its_own(double, tmp_path):
    worker = faulty_worker(tmp_path, "redis")
    settings = settings_beside(worker, tmp_path)
    rogue = redis.Redis.from_url(worker.env["ANIMEGAMER_RESULT_BACKEND"])  # the workers' own credentials
    try:
        async with running_bot(double, settings, worker) as bot:
            job_id, bob_task = await bobs_turn_running(double, settings)
            forged = {"status": "SUCCESS", "result": forged_result(job_id), "traceback": None, "children": [],
                      "date_done": "2026-12-07T00:00:00", "task_id": bob_task}  # fmt: skip
            rogue.set(f"celery-task-meta-{bob_task}", json.dumps(forged))  # a clip of its own, as Bob's turn's
            rows, rejected = await bobs_turn_posted(settings, bot)
    finally:
        worker.kill(signal.SIGKILL)
    clips = posted_clips(double)
    assert rows[0][0] == JobStatus.DONE and len(clips) == 1  # Bob's turn posted once
    assert clips[0] != FORGED_MP4  # with the clip his worker made, not the one the rogue wrote
    assert rejected >= 1


async def test_a_result_forged_over_a_finished_turns_own_is_rejected_and_the_turn_is_made_again(double, tmp_path):
    """The worker's own result is stored while no bot runs, and the rogue writes over it: the bot that starts reads
    only the forged one, drops it, finds the worker's claim ended with no result, and the turn is made again and
    posted once with a clip of its worker's."""
    worker = faulty_worker(tmp_path, "redis")
    settings = settings_beside(worker, tmp_path)
    rogue = redis.Redis.from_url(worker.env["ANIMEGAMER_RESULT_BACKEND"])
    try:
        async with running_bot(double, settings, worker):
            job_id, bob_task = await bobs_turn_running(double, settings)
        key = f"celery-task-meta-{bob_task}"
        for _ in range(600):  # the worker finishes the turn with no bot to take it
            stored = rogue.get(key)
            if stored is not None and json.loads(stored)["status"] == "SUCCESS":
                break
            await asyncio.sleep(0.1)
        assert json.loads(stored)["result"]["proof"], stored
        forged = {**json.loads(stored), "result": forged_result(job_id)}
        rogue.set(key, json.dumps(forged))
        async with running_bot(double, settings, worker) as bot:
            rows, rejected = await bobs_turn_posted(settings, bot)
    finally:
        worker.kill(signal.SIGKILL)
    clips = posted_clips(double)
    assert rows[0][0] == JobStatus.DONE and rows[0][2] == 2 and len(clips) == 1  # made again, posted once
    assert clips[0] != FORGED_MP4 and rejected == 1


FORGED_MP4 = encode_mp4(np.full((17, 64, 96, 3), 200, np.uint8), fps=8)


def forged_result(job_id: int) -> dict:
    """A well-formed result of this release for ``job_id``, clean by its own word, and no proof of the turn's."""
    return turn_result(
        job_id, mp4=FORGED_MP4, num_frames=17, height=64, width=96, safety=report(FACE_FEMALE=0.01)
    ).model_dump(mode="json")
