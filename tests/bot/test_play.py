"""Playing alone, end to end: the real bot, the loopback Discord, a real worker on the tiny model."""

from __future__ import annotations

import io

import av
import pytest
from sqlalchemy import select

from db.models import Character, Job, JobStatus, Turn
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.bot.helpers import accepted, private_text, shown
from tests.discord_double import member

pytestmark = pytest.mark.slow

ALICE = member("alice")


def mp4_frames(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


async def start(double, user=ALICE, character="Qiqi"):
    handle = await double.slash("start", {"character": character}, user=user)
    return shown(await handle.answer())


async def test_act_posts_a_playable_clip_and_moves_the_state_by_exactly_the_result(
    double, worker_settings, sqlite_worker
):
    async with running_bot(double, worker_settings, sqlite_worker):
        await start(double)
        act = await double.slash("act", {"motion": "gently fly on broomstick", "background": "night sky"}, user=ALICE)
        await accepted(act)  # deferred within the deadline, then the progress message
        post = await double.wait_for("POST", r"/channels/\d+/messages", timeout=90)
        await wait_for_db(worker_settings, select(Job.result_message_id), lambda rows: rows[0][0] is not None)

    clips = [f for f in post.files if f.filename.endswith(".mp4")]
    assert len(clips) == 1 and mp4_frames(clips[0].data) == 17
    assert [int(u) for u in post.json["allowed_mentions"]["users"]] == [ALICE.user.id]
    ((character, turn, job),) = await read_db(
        worker_settings, select(Character, Turn, Job).join(Turn, Turn.character_id == Character.id).join(Job)
    )
    assert job.status == JobStatus.DONE and job.result_message_id is not None
    assert (character.stamina, character.social, character.entertainment) == (
        50 + 5 * turn.d_stamina,
        50 + 5 * turn.d_social,
        50 + 5 * turn.d_entertainment,
    )


async def test_act_without_a_character_is_refused_privately(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        act = await double.slash("act", {"motion": "wave", "background": "town"}, user=member("bob"))
        text = private_text(await act.answer())
    assert "/start" in text
