"""Every clip passes the worker's nudity detector, and the server's policy decides where it may be posted.

Turns are put on record as the supervisor leaves them (result applied, not yet posted) with the detector report a
test chooses, and the real bot posts them through the loopback Discord: a clip the policy withholds is never
uploaded, its player is told privately why, the turn still counts, and the decision is in the audit log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select

from db.models import AuditLog, Character, Job, Turn
from game.safety import SafetyReport, unchecked
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.bot.helpers import clip_path, seed_turn
from tests.discord_double import Channel, DiscordDouble, Guild, thread

CLEAN = SafetyReport(detector="test", scores={"FACE_FEMALE": 0.9, "BUTTOCKS_EXPOSED": 0.04}, frames=17)
FLAGGED = SafetyReport(detector="test", scores={"FACE_FEMALE": 0.9, "BUTTOCKS_EXPOSED": 0.83}, frames=17)


async def finished(double: DiscordDouble, settings, safety: SafetyReport, channel=None) -> int:
    """A turn whose result the supervisor applied with ``safety`` as its report, for the delivery to post."""
    channel_id = (channel or double.guild.channel).id
    return await seed_turn(
        settings, double.guild.id, channel_id, double.player.id, done=True, posted=False, safety=safety
    )


async def post_of(double: DiscordDouble, settings, job_id: int):
    """The channel message the bot posted for ``job_id``, once the delivery recorded it."""
    ((message_id,),) = await wait_for_db(
        settings, select(Job.result_message_id).where(Job.id == job_id), lambda rows: rows and rows[0][0], timeout=30
    )
    return double.message(message_id)


async def test_a_clean_clip_is_posted_and_its_scores_are_kept(double, bot_settings):
    async with running_bot(double, bot_settings):
        job_id = await seed_turn(
            bot_settings,
            double.guild.id,
            double.guild.channel.id,
            double.player.id,
            done=True,
            posted=False,
            safety=CLEAN,
        )
        post = await post_of(double, bot_settings, job_id)
    assert any(f.filename.endswith(".mp4") for f in post.files.values())
    ((safety, withheld),) = await read_db(bot_settings, select(Turn.safety, Turn.clip_withheld))
    assert SafetyReport.model_validate_json(safety) == CLEAN and withheld is None
    assert await read_db(bot_settings, select(AuditLog.action)) == []  # a clean clip is no decision to review


async def test_a_flagged_clip_is_never_uploaded_and_its_player_is_told_privately_why(double, bot_settings):
    async with running_bot(double, bot_settings):
        job_id = await seed_turn(
            bot_settings,
            double.guild.id,
            double.guild.channel.id,
            double.player.id,
            done=True,
            posted=False,
            safety=FLAGGED,
        )
        post = await post_of(double, bot_settings, job_id)
        told = await double.wait_until(lambda: double.dms(double.player), 10, "a DM to the player")
    assert [f.filename for f in post.files.values()] == ["state.png"]  # the state card, never the clip
    assert "withheld" in post.content
    assert "buttocks exposed, 0.83" in told[0].content and "still counts" in told[0].content
    assert not clip_path(bot_settings, double.guild.id, job_id).exists()
    ((withheld, key),) = await read_db(bot_settings, select(Turn.clip_withheld, Turn.clip_key))
    assert "flagged" in withheld and key is None
    ((action, target, details),) = await read_db(
        bot_settings, select(AuditLog.action, AuditLog.target, AuditLog.details)
    )
    assert (action, target) == ("clip withheld", f"job {job_id}") and "0.83" in details


async def test_the_turn_of_a_withheld_clip_still_counts(double, bot_settings):
    async with running_bot(double, bot_settings):
        job_id = await seed_turn(
            bot_settings,
            double.guild.id,
            double.guild.channel.id,
            double.player.id,
            done=True,
            posted=False,
            safety=FLAGGED,
        )
        await post_of(double, bot_settings, job_id)
    ((social,),) = await read_db(bot_settings, select(Character.social))
    ((instruction, after),) = await read_db(bot_settings, select(Turn.instruction, Turn.social_after))
    assert after == social and "wave" in instruction  # applied: the story goes on without the clip


async def test_a_clip_its_worker_could_not_check_is_withheld(double, bot_settings):
    report = unchecked("the detector failed: RuntimeError")
    async with running_bot(double, bot_settings):
        job_id = await seed_turn(
            bot_settings,
            double.guild.id,
            double.guild.channel.id,
            double.player.id,
            done=True,
            posted=False,
            safety=report,
        )
        post = await post_of(double, bot_settings, job_id)
        told = await double.wait_until(lambda: double.dms(double.player), 10, "a DM to the player")
    assert not any(f.filename.endswith(".mp4") for f in post.files.values())
    assert "could not be checked" in told[0].content
    assert [a for (a,) in await read_db(bot_settings, select(AuditLog.action))] == ["clip withheld"]


# -- the server's policy: age-restricted channels ----------------------------------------------------------------

OPEN, AFTER_DARK = Channel("general"), Channel("after-dark", nsfw=True)
IN_AFTER_DARK = thread("late-night story", parent=AFTER_DARK)


@pytest.fixture
async def nsfw_double() -> AsyncIterator[DiscordDouble]:
    async with DiscordDouble([Guild(channels=[OPEN, AFTER_DARK, IN_AFTER_DARK])]) as running:
        yield running


async def allow_in_age_restricted_channels(double: DiscordDouble) -> None:
    handle = await double.slash("admin safety", {"policy": "age_restricted"}, user=double.guild.owner)
    assert "age-restricted channels only" in (await handle.answer()).json["content"]


@pytest.mark.parametrize("channel", [AFTER_DARK, IN_AFTER_DARK], ids=["age-restricted channel", "thread in one"])
async def test_under_that_policy_a_flagged_clip_is_posted_as_is_in_an_age_restricted_channel(
    nsfw_double, bot_settings, channel
):
    async with running_bot(nsfw_double, bot_settings):
        await allow_in_age_restricted_channels(nsfw_double)
        job_id = await finished(nsfw_double, bot_settings, FLAGGED, channel)
        post = await post_of(nsfw_double, bot_settings, job_id)
    assert any(f.filename.endswith(".mp4") for f in post.files.values())
    actions = [a for (a,) in await read_db(bot_settings, select(AuditLog.action).order_by(AuditLog.id))]
    assert actions == ["safety", "clip posted (flagged)"]


async def test_under_that_policy_a_flagged_clip_is_withheld_in_any_other_channel(nsfw_double, bot_settings):
    async with running_bot(nsfw_double, bot_settings):
        await allow_in_age_restricted_channels(nsfw_double)
        job_id = await finished(nsfw_double, bot_settings, FLAGGED, OPEN)
        post = await post_of(nsfw_double, bot_settings, job_id)
    assert not any(f.filename.endswith(".mp4") for f in post.files.values())
    ((withheld,),) = await read_db(bot_settings, select(Turn.clip_withheld))
    assert "not age-restricted" in withheld


async def test_an_unchecked_clip_is_withheld_even_in_an_age_restricted_channel(nsfw_double, bot_settings):
    async with running_bot(nsfw_double, bot_settings):
        await allow_in_age_restricted_channels(nsfw_double)
        job_id = await finished(nsfw_double, bot_settings, unchecked("no detector"), AFTER_DARK)
        post = await post_of(nsfw_double, bot_settings, job_id)
    assert not any(f.filename.endswith(".mp4") for f in post.files.values())


async def test_a_servers_own_threshold_decides_what_is_flagged(double, bot_settings):
    async with running_bot(double, bot_settings):
        handle = await double.slash("admin safety", {"threshold": 0.9}, user=double.guild.owner)
        assert "0.90 (this server's)" in (await handle.answer()).json["content"]
        job_id = await finished(double, bot_settings, FLAGGED)  # 0.83: flagged at the default 0.5, not at 0.9
        post = await post_of(double, bot_settings, job_id)
    assert any(f.filename.endswith(".mp4") for f in post.files.values())
