"""What a player sees around one turn: progress, the result's buttons, the queue, cancelling."""

from __future__ import annotations

import asyncio
import io
import re

import av
import pytest
from sqlalchemy import select

from db.jobs import apply_result, create_turn
from db.models import Character, Job, JobStatus, Turn
from db.queries import get_or_create_character
from game.contract import FULL_RANDOM_WEIGHTS_LABEL
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.bot.helpers import accepted, db_session, shown
from tests.discord_double import member
from tests.results import turn_result

pytestmark = pytest.mark.slow

ALICE = member("alice")
LINE = "Character: Qiqi; Motion: gently lie down; Background: day grass."


async def start_and_act(double, instruction: str = LINE):
    await (await double.slash("start", {"character": "Qiqi"}, user=ALICE)).answer()
    handle = await double.slash("act", {"instruction": instruction}, user=ALICE)
    await accepted(handle)
    return handle


async def posted(settings) -> tuple[int, int]:
    (job_id, message_id), *_ = await wait_for_db(
        settings, select(Job.id, Job.result_message_id), lambda rows: rows and rows[-1][1], timeout=90
    )
    return job_id, message_id


async def test_the_progress_message_shows_the_queue_place_and_an_eta_then_done(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        await start_and_act(double)
        first = await double.wait_for("PATCH", r"/webhooks/\d+/[^/]+/messages/@original")
        await posted(worker_settings)
        done = await double.wait_for("PATCH", r"/channels/\d+/messages/\d+", timeout=10)
    assert re.search(r"Queued, next in line; ready <t:\d+:R>\.", first.json["content"])
    edits = [c.json["content"] for c in double.calls_to("PATCH", r"/channels/\d+/messages/\d+")]
    assert done.json["content"] in edits and "Done" in edits[-1]


async def test_the_start_autocomplete_offers_the_known_characters(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        choices = await (await double.autocomplete("start", "character", "qi", user=ALICE)).choices()
        nonsense = await (await double.autocomplete("start", "character", "\u200b%%<@1>", user=ALICE)).choices()
    assert [c["value"] for c in choices] == ["Qiqi"]
    assert nonsense == []


async def test_a_clip_over_the_upload_limit_is_re_encoded_smaller_not_dropped(double, worker_settings, sqlite_worker):
    settings = worker_settings.model_copy(update={"upload_limit_bytes": 12_000})
    async with running_bot(double, settings, sqlite_worker):
        await start_and_act(double)
        post = await double.wait_for("POST", r"/channels/\d+/messages", timeout=90)
    (clip,) = [f for f in post.files if f.filename.endswith(".mp4")]
    assert len(clip.data) <= 12_000
    with av.open(io.BytesIO(clip.data)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 17


async def test_details_tells_the_seed_model_and_timings_privately(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        await start_and_act(double)
        job_id, message_id = await posted(worker_settings)
        click = await double.button(message_id, f"ag:turn:{job_id}:details", user=member("someone"))
        body = (await click.response()).json
    ((seed,),) = await read_db(worker_settings, select(Turn.seed))
    assert body["data"]["flags"] & 64
    assert f"seed {seed}" in body["data"]["content"] and "denoise" in body["data"]["content"]


async def test_continue_opens_a_prefilled_modal_whose_submission_takes_the_next_turn(
    double, worker_settings, sqlite_worker
):
    async with running_bot(double, worker_settings, sqlite_worker):
        await start_and_act(double)
        job_id, message_id = await posted(worker_settings)
        click = await double.button(message_id, f"ag:turn:{job_id}:continue", user=ALICE)
        modal = (await click.response()).json
        assert modal["type"] == 9
        (field,) = [c for row in modal["data"]["components"] for c in row["components"]]
        assert field["value"] == LINE
        nxt = "Character: Qiqi; Motion: quickly run; Background: night street."
        submit = await double.modal_submit(modal["data"]["custom_id"], {field["custom_id"]: nxt}, user=ALICE)
        await accepted(submit)
        await wait_for_db(
            worker_settings, select(Job.result_message_id), lambda r: len(r) == 2 and all(m for (m,) in r), timeout=90
        )
    assert [t for (t,) in await read_db(worker_settings, select(Turn.instruction).order_by(Turn.id))] == [LINE, nxt]


async def test_another_players_reroll_is_refused(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        await start_and_act(double)
        job_id, message_id = await posted(worker_settings)
        click = await double.button(message_id, f"ag:turn:{job_id}:reroll", user=member("mallory"))
        body = (await click.response()).json
    assert body["data"]["flags"] & 64 and "Only the player" in body["data"]["content"]
    assert len(await read_db(worker_settings, select(Job.id))) == 1


async def test_queue_lists_the_turn_and_cancel_stops_it_changing_the_character(double, worker_settings, sqlite_worker):
    settings = worker_settings
    async with running_bot(double, settings, sqlite_worker) as bot:
        await bot.supervisor.stop()  # hold results back so the turn stays in flight while we look
        await start_and_act(double)
        queue = shown(await (await double.slash("queue", user=ALICE)).answer())["content"]
        cancel = shown(await (await double.slash("cancel", user=ALICE)).answer())["content"]
        bot.supervisor.start()
        await asyncio.sleep(5)  # the worker finishes the turn; its result must not be applied
    assert "turn" in queue and "Cancelled" in cancel
    ((status,),) = await read_db(settings, select(Job.status))
    assert status == JobStatus.CANCELLED
    ((stamina, social, entertainment),) = await read_db(
        settings, select(Character.stamina, Character.social, Character.entertainment)
    )
    assert (stamina, social, entertainment) == (50, 50, 50)
    assert not [c for c in double.calls_to("POST", r"/channels/\d+/messages") if c.files]


async def test_a_finished_turn_is_posted_with_the_label_its_worker_gave_it(double, worker_settings, sqlite_worker):
    """Random weights at the published sizes (model "full") were posted unlabelled: the label came from a
    table of model names instead of the worker's result."""
    guild, channel = double.guild, double.guild.channel
    async with running_bot(double, worker_settings, sqlite_worker):
        async with db_session(worker_settings) as session:
            played = await get_or_create_character(session, guild.id, ALICE.id, "Qiqi")
            _, job = await create_turn(
                session, played, LINE, 7, "full", guild_id=guild.id, channel_id=channel.id, user_id=ALICE.id
            )
            result = turn_result(job.id, model="full", label=FULL_RANDOM_WEIGHTS_LABEL)
            assert await apply_result(session, job.id, result, None)
        post = await double.wait_for("POST", rf"/channels/{channel.id}/messages", timeout=30)
    assert FULL_RANDOM_WEIGHTS_LABEL in post.json["embeds"][0]["footer"]["text"]
