"""The published model's way: each character's pair on its own queue, the bot offering what is served.

A worker loads a tiny checkpoint tree in the release's layout (Qiqi only) through the same code
that loads the published files, on Redis, which lets the bot ask workers what they consume.
"""

from __future__ import annotations

import io
import json

import av
import pytest
from sqlalchemy import select

from db.models import Job
from tests.bot.conftest import running_bot, wait_for_db
from tests.bot.helpers import refusal
from tests.checkpoints.release_tree import write_tiny_release
from tests.discord_double import member
from tests.workers import redis_url_or_skip, settings_for, start_worker, worker_env

pytestmark = pytest.mark.slow

ALICE = member("alice")


async def test_a_qiqi_only_worker_is_offered_and_routed_to_and_sosuke_is_not(double, tmp_path):
    url = redis_url_or_skip()
    tree = write_tiny_release(tmp_path / "checkpoints")
    env = worker_env(
        tmp_path / "worker",
        url,
        ANIMEGAMER_MODEL="animegamer",
        ANIMEGAMER_CHECKPOINTS=str(tree.root),
        ANIMEGAMER_CHARACTERS=json.dumps(["Qiqi"]),
        ANIMEGAMER_DEVICE="cpu",
        ANIMEGAMER_NUM_STEPS="2",
    )
    worker = start_worker(env)
    settings = settings_for({k: v for k, v in env.items() if k != "ANIMEGAMER_CHARACTERS"}).model_copy(
        update={
            "database_url": f"sqlite+aiosqlite:///{tmp_path}/game.db",
            "data_dir": tmp_path,
            "delivery_poll_seconds": 0.1,
            "characters": ["Qiqi", "Sosuke"],
        }
    )
    try:
        async with running_bot(double, settings, worker):
            offered = await (await double.autocomplete("start", "character", "", user=ALICE)).choices()
            assert [c["value"] for c in offered] == ["Qiqi"]
            sosuke = await double.slash("start", {"character": "Sosuke"}, user=ALICE)
            refusal(await sosuke.answer(), "No worker plays Sosuke", "Qiqi")  # it would wait on a queue nobody reads
            await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
            await (
                await double.slash("act", {"motion": "gently wave", "background": "day town"}, user=ALICE)
            ).response()
            post = await double.wait_for("POST", r"/channels/\d+/messages", timeout=180)
            await wait_for_db(settings, select(Job.result_message_id), lambda rows: rows[0][0] is not None)
    finally:
        worker.kill()
    (clip,) = [f for f in post.files if f.filename.endswith(".mp4")]
    with av.open(io.BytesIO(clip.data)) as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height) == (720, 480)  # the published clip size, from the tiny pair
    assert "random weights" not in json.dumps(post.json)  # loaded checkpoints are not labelled as noise
