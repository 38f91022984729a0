"""Bad input: each gets a clear private answer, pings nobody, and leaves the database as it was.

Instructions with mentions, markdown, invisible characters, 4,000 characters or only spaces; autocomplete
fed nonsense; buttons and forms for turns that were purged or belong to another server; a form sent twice.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from db.models import Job, JobStatus
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.bot.helpers import (
    LINE,
    accepted,
    idle_queue,
    private_text,
    refusal,
    running_bot_on,
    seed_turn,
    turns_and_jobs,
)
from tests.discord_double import DiscordDouble, Guild, member

ALICE = member("alice")
MOD = member("mod", manage_guild=True)
NONSENSE = "\u200b<@&1>**~~||" + "ñ" * 300 + "\x00"


async def start(double, user=ALICE) -> None:
    handle = await double.slash("start", {"character": "Qiqi"}, user=user)
    assert "You play" in private_text(await handle.answer())


async def refused_act(double, settings, options: dict, *words: str) -> str:
    """/act with ``options`` as Alice (who plays Qiqi): refused with ``words``, and no turn on record."""
    await start(double)
    handle = await double.slash("act", options, user=ALICE)
    text = refusal(await handle.answer(), *words)
    assert await turns_and_jobs(settings) == (0, 0)
    return text


async def purge(double, user=ALICE) -> None:
    handle = await double.slash("admin purge", {"user": user}, user=MOD)
    assert "Deleted" in private_text(await handle.answer())


async def open_continue_form(double, job_id: int, user=ALICE) -> tuple[str, str]:
    """Click Continue under a turn; returns the form's custom id and its text box's."""
    click = await double.button(None, f"ag:turn:{job_id}:continue", user=user)
    body = (await click.response()).json
    assert body["type"] == 9, body
    return body["data"]["custom_id"], body["data"]["components"][0]["components"][0]["custom_id"]


# -- what a player types --------------------------------------------------------------------------------


@pytest.mark.parametrize("motion", ["wave at <@1234567890>", "wave at @everyone", "greet <@&42> and <#7>"])
async def test_an_instruction_with_a_mention_is_refused_and_pings_nobody(double, bot_settings, motion):
    async with running_bot(double, bot_settings):
        await refused_act(double, bot_settings, {"motion": motion, "background": "town"}, "Motion contains")


@pytest.mark.parametrize("motion", ["**fly** high", "fly `high`", "fly ~~low~~", "fly ||high||", "# fly", "> fly"])
async def test_an_instruction_with_markdown_is_refused_naming_the_character(double, bot_settings, motion):
    async with running_bot(double, bot_settings):
        text = await refused_act(double, bot_settings, {"motion": motion, "background": "town"}, "Motion contains")
    assert "letters, digits and simple punctuation" in text


@pytest.mark.parametrize("char", ["\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad"])
async def test_an_instruction_with_an_invisible_character_is_refused_showing_its_code(double, bot_settings, char):
    async with running_bot(double, bot_settings):
        motion = f"gently fly{char} on broomstick"
        await refused_act(double, bot_settings, {"motion": motion, "background": "sky"}, f"U+{ord(char):04X}")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"motion": "a" * 4000, "background": "town"}, "Motion is 4000 characters; the most is 60"),
        ({"instruction": "Character: Qiqi; Motion: " + "a" * 4000 + "; Background: town."}, "at most 200"),
    ],
    ids=["field", "line"],
)
async def test_a_4000_character_instruction_is_refused_without_echoing_it(double, bot_settings, options, said):
    async with running_bot(double, bot_settings):
        text = await refused_act(double, bot_settings, options, said)
    assert "aaaa" not in text


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"motion": "     ", "background": "town"}, "Motion is empty"),
        ({"motion": "wave", "background": " \t "}, "Background is empty"),
        ({"instruction": "      "}, "labelled parts"),
    ],
    ids=["motion", "background", "line"],
)
async def test_an_instruction_of_only_spaces_is_refused(double, bot_settings, options, said):
    async with running_bot(double, bot_settings):
        await refused_act(double, bot_settings, options, said)


async def test_a_character_name_of_only_spaces_or_markup_is_refused(double, bot_settings):
    async with running_bot(double, bot_settings):
        for name, said in (("    ", "The name is empty"), ("<@1234>", "The name contains")):
            handle = await double.slash("start", {"character": name}, user=ALICE)
            refusal(await handle.answer(), said)
    assert await read_db(bot_settings, select(Job.id)) == []


async def test_a_time_typed_past_the_suggestions_is_refused_with_the_choices(double, bot_settings):
    async with running_bot(double, bot_settings):
        await refused_act(
            double, bot_settings, {"motion": "wave", "background": "town", "time": "teatime"}, "Time must be one of"
        )


# -- autocomplete ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("act", "character"),
        ("act", "time"),
        ("act", "motion"),
        ("act", "background"),
        ("story act", "motion"),
        ("start", "character"),
    ],
)
async def test_autocomplete_fed_nonsense_suggests_nothing(double, bot_settings, command, option):
    async with running_bot(double, bot_settings):
        handle = await double.autocomplete(command, option, NONSENSE, user=ALICE)
        assert await handle.choices() == []
        sane = await double.autocomplete(command, option, "", user=ALICE)
        assert 0 < len(await sane.choices()) <= 25


# -- turns that were purged, or belong elsewhere --------------------------------------------------------


async def test_a_button_under_a_purged_turn_says_the_turn_is_gone(double, bot_settings):
    guild = double.guild
    async with running_bot(double, bot_settings):
        job_id = await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, done=True)
        await purge(double)
        for action in ("reroll", "continue", "details"):
            click = await double.button(None, f"ag:turn:{job_id}:{action}", user=ALICE)
            refusal(await click.answer(), "no longer exists", "purged")
    assert await turns_and_jobs(bot_settings) == (0, 0)


async def test_a_continue_form_sent_after_its_turn_was_purged_says_the_turn_is_gone(double, bot_settings):
    guild = double.guild
    async with running_bot(double, bot_settings):
        job_id = await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, done=True)
        form, box = await open_continue_form(double, job_id)
        await purge(double)
        sent = await double.modal_submit(form, {box: LINE}, user=ALICE)
        refusal(await sent.answer(), "no longer exists")
    assert await turns_and_jobs(bot_settings) == (0, 0)


async def test_a_button_under_a_turn_from_another_server_is_refused(bot_settings):
    here, there = Guild("here"), Guild("there")
    async with DiscordDouble([here, there]) as double, running_bot(double, bot_settings):
        job_id = await seed_turn(bot_settings, there.id, there.channel.id, ALICE.id, done=True)
        await start(double)  # Alice plays here too
        click = await double.button(None, f"ag:turn:{job_id}:reroll", user=ALICE)  # a message in "here"
        refusal(await click.answer(), "another server")
    assert await turns_and_jobs(bot_settings) == (1, 1)


async def test_a_button_with_an_impossible_job_id_says_the_turn_is_gone(double, bot_settings):
    async with running_bot(double, bot_settings):
        click = await double.button(None, "ag:turn:" + "9" * 30 + ":details", user=ALICE)
        refusal(await click.answer(), "no longer exists")


# -- a form sent twice ----------------------------------------------------------------------------------


async def test_a_continue_form_sent_twice_at_once_makes_one_turn(double, bot_settings, tmp_path):
    guild = double.guild
    async with running_bot_on(double, bot_settings, idle_queue(bot_settings, tmp_path)):
        job_id = await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, done=True)
        form, box = await open_continue_form(double, job_id)
        first = await double.modal_submit(form, {box: LINE}, user=ALICE)
        second = await double.modal_submit(form, {box: LINE}, user=ALICE)  # before the first is answered
        # The two race inside the bot; whichever commits first queues the turn, the other is refused.
        answers = [await first.answer(), await second.answer()]
        assert sorted(answer.method for answer in answers) == ["PATCH", "POST"]  # one progress message, one refusal
        refusal(next(answer for answer in answers if answer.method == "POST"), "still being made")
        await wait_for_db(bot_settings, select(Job.progress_message_id), lambda rows: len(rows) == 2 and rows[1][0])
    statuses = await read_db(bot_settings, select(Job.status).order_by(Job.id))
    assert statuses == [(JobStatus.DONE,), (JobStatus.QUEUED,)]


async def test_a_continue_form_sent_again_after_its_turn_was_queued_gets_an_answer(double, bot_settings, tmp_path):
    guild = double.guild
    async with running_bot_on(double, bot_settings, idle_queue(bot_settings, tmp_path)):
        job_id = await seed_turn(bot_settings, guild.id, guild.channel.id, ALICE.id, done=True)
        form, box = await open_continue_form(double, job_id)
        first = await double.modal_submit(form, {box: LINE}, user=ALICE)
        await accepted(first)
        await wait_for_db(bot_settings, select(Job.progress_message_id), lambda rows: len(rows) == 2 and rows[1][0])
        again = await double.modal_submit(form, {box: LINE}, user=ALICE)
        private_text(await again.answer())
    assert await turns_and_jobs(bot_settings) == (2, 2)
