"""Shared story channels: three players, one world, the story's own history."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import av
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import undefer

from db.engine import make_engine, make_sessionmaker
from db.jobs import history_turn
from db.models import Character, GuildSettings, Job, Story, StoryStatus, Turn
from game.contract import TurnRequest
from game.safety import SafetyReport
from tests.bot.clip_samples import FRAMES, story_clips
from tests.bot.conftest import read_db, running_bot, wait_for_db
from tests.bot.helpers import accepted, db_session, game_store, kept_recaps, private_text, seed_turn, shown
from tests.discord_double import member
from tests.results import report

PLAYERS = [member("alice"), member("bob"), member("carol")]
NAMES = ["Qiqi", "Sosuke", "Kiki"]
MOVES = [("gently fly on broomstick", "night sky"), ("quickly run", "day town"), ("gently wave", "day street")]


async def set_history_window(settings, window: int) -> None:
    engine = make_engine(settings.database_url)
    async with make_sessionmaker(engine)() as session, session.begin():
        await session.execute(update(GuildSettings).values(history_window=window))
    await engine.dispose()


async def begin_story(double, order: str = "free") -> None:
    await (await double.slash("story start", {"title": "Night flight", "order": order}, user=PLAYERS[0])).answer()
    for player, name in zip(PLAYERS, NAMES, strict=True):
        await (await double.slash("start", {"character": name}, user=player)).answer()
        await (await double.slash("story join", user=player)).answer()


async def add_finished_turns(
    settings, clips: list[Path], first_seq: int = 1, safety: list[SafetyReport] | None = None
) -> None:
    """Story turns as the delivery loop leaves them once posted, with these clips (and these detector reports;
    none: turns recorded before clips were checked).

    The worker's tiny model makes 64x96 clips; these are 720x480, the published size, without a GPU.
    """
    engine = make_engine(settings.database_url)
    async with make_sessionmaker(engine)() as session, session.begin():
        story_id = (await session.execute(select(Story.id).where(Story.status == StoryStatus.ACTIVE))).scalar_one()
        characters = list((await session.execute(select(Character.id).order_by(Character.id))).scalars())
        for seq, clip in enumerate(clips, start=first_seq):
            state = {"stamina_after": 50, "social_after": 50, "entertainment_after": 50}
            session.add(
                Turn(
                    character_id=characters[seq % len(characters)],
                    story_id=story_id,
                    seq=seq,
                    instruction=f"Character: Qiqi; Motion: step {seq}; Background: town.",
                    seed=seq,
                    model="tiny",
                    clip_key=str(clip),  # a path outside the clip folder reads as itself
                    safety=safety[seq - first_seq].model_dump_json() if safety else None,
                    **state,
                )
            )
    await engine.dispose()


def recap_clip(followup) -> bytes:
    (clip,) = [f for f in followup.files if f.filename.endswith(".mp4")]
    return clip.data


def decoded_frames(mp4: bytes) -> int:
    with av.open(io.BytesIO(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


async def story_turn(double, settings, player, motion, background, done: int) -> None:
    handle = await double.slash("story act", {"motion": motion, "background": background}, user=player)
    await accepted(handle)
    await wait_for_db(
        settings, select(Job.result_message_id), lambda rows: sum(r[0] is not None for r in rows) == done, timeout=90
    )


@pytest.mark.slow
async def test_three_players_turns_are_recorded_in_order_and_carry_the_storys_history(
    double, worker_settings, sqlite_worker, tiny_pipeline
):
    async with running_bot(double, worker_settings, sqlite_worker):
        await begin_story(double)
        await set_history_window(worker_settings, 3)
        for done, (player, (motion, background)) in enumerate(zip(PLAYERS, MOVES, strict=True), start=1):
            await story_turn(double, worker_settings, player, motion, background, done)

    rows = await read_db(
        worker_settings,
        select(Turn, Character.name)
        .join(Character)
        .where(Turn.story_id.is_not(None))
        .order_by(Turn.seq)
        .options(undefer(Turn.representation)),  # deferred: only prompts read it
    )
    assert [(turn.seq, name) for turn, name in rows] == [(1, "Qiqi"), (2, "Sosuke"), (3, "Kiki")]

    # Carol's turn was made with the story's two earlier turns (Alice's and Bob's) as its history:
    # the same request, computed here by the same tiny model, gives the representation the bot stored.
    past = [history_turn(turn) for turn, _ in rows[:2]]
    carol = rows[2][0]
    expected = tiny_pipeline(TurnRequest(job_id="check", instruction=carol.instruction, seed=carol.seed, history=past))
    assert expected.representation == carol.representation
    alone = tiny_pipeline(TurnRequest(job_id="check", instruction=carol.instruction, seed=carol.seed))
    assert alone.representation != carol.representation


async def test_round_robin_refuses_a_player_out_of_turn(double, bot_settings):
    async with running_bot(double, bot_settings):
        await begin_story(double, order="round_robin")
        handle = await double.slash("story act", {"motion": "quickly run", "background": "town"}, user=PLAYERS[1])
        text = private_text(await handle.answer())
    assert "Qiqi's turn" in text
    assert await read_db(bot_settings, select(Turn.id)) == []


async def test_a_second_story_in_the_same_channel_is_refused(double, bot_settings):
    async with running_bot(double, bot_settings):
        await begin_story(double)
        handle = await double.slash("story start", {"title": "Another"}, user=PLAYERS[1])
        text = private_text(await handle.answer())
    assert "already has a story" in text
    assert len(await read_db(bot_settings, select(Story.id))) == 1


@pytest.mark.slow
async def test_recap_posts_the_story_as_one_clip_and_a_link_free_summary(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        await begin_story(double)
        for done, (player, (motion, background)) in enumerate(zip(PLAYERS[:2], MOVES[:2], strict=True), start=1):
            await story_turn(double, worker_settings, player, motion, background, done)
        recap = await double.slash("story recap", user=PLAYERS[2])
        (followup,) = await recap.followups(timeout=60)
    (clip,) = [f for f in followup.files if f.filename.endswith(".mp4")]
    import io

    import av

    with av.open(io.BytesIO(clip.data)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 34  # two 17-frame turns
    text = followup.json["content"]
    assert "gently fly on broomstick" in text and "quickly run" in text and "http" not in text


async def test_a_second_recap_with_no_new_turn_posts_the_kept_clip_without_encoding_again(
    double, bot_settings, tmp_path
):
    settings = bot_settings.model_copy(update={"recap_cooldown_seconds": 0})
    clips = story_clips(tmp_path / "made", turns=4)
    async with running_bot(double, settings):
        store = game_store(settings)
        await begin_story(double)
        await add_finished_turns(settings, clips[:3])
        (first,) = await (await double.slash("story recap", user=PLAYERS[2])).followups(timeout=60)
        (kept,) = kept_recaps(store)
        made = store.path(kept).stat()
        (again,) = await (await double.slash("story recap", user=PLAYERS[1])).followups(timeout=60)
        reused = store.path(kept).stat()
        await add_finished_turns(settings, clips[3:], first_seq=4)
        (later,) = await (await double.slash("story recap", user=PLAYERS[0])).followups(timeout=60)
    assert recap_clip(again) == recap_clip(first)
    assert (reused.st_ino, reused.st_mtime_ns) == (made.st_ino, made.st_mtime_ns)  # not made again
    assert decoded_frames(recap_clip(later)) == 4 * FRAMES
    assert kept_recaps(store) != [kept]  # the outdated recap is gone
    assert len(kept_recaps(store)) == 1


async def test_a_recap_leaves_out_a_clip_the_servers_policy_withholds_here(double, bot_settings, tmp_path):
    clean, flagged = report(ANUS_EXPOSED=0.01), report(ANUS_EXPOSED=0.9)
    async with running_bot(double, bot_settings):
        await begin_story(double)
        await add_finished_turns(bot_settings, story_clips(tmp_path / "made", turns=2), safety=[flagged, clean])
        (recap,) = await (await double.slash("story recap", user=PLAYERS[2])).followups(timeout=60)
    assert decoded_frames(recap_clip(recap)) == FRAMES  # the clean clip alone
    assert "step 1" in recap.json["content"]  # the withheld clip's turn is still told


async def test_purging_a_story_member_deletes_the_kept_recap_that_shows_their_turns(double, bot_settings, tmp_path):
    async with running_bot(double, bot_settings):
        store = game_store(bot_settings)
        await begin_story(double)
        await add_finished_turns(bot_settings, story_clips(tmp_path / "made", turns=3))
        await (await double.slash("story recap", user=PLAYERS[2])).followups(timeout=60)
        assert kept_recaps(store)
        await (await double.slash("admin purge", {"user": PLAYERS[1]}, user=double.guild.owner)).answer()
        await double.wait_until(lambda: not kept_recaps(store), 10, "the kept recap to be deleted")


def posted_with(double, suffix: str) -> list:
    """The messages up in Discord that carry a file ending in ``suffix``."""
    return [m for m in double.messages() if any(a["filename"].endswith(suffix) for a in m.attachments)]


async def story_turn_of_job(settings, guild, clip: Path) -> int:
    """A finished, posted turn of a job, made the story's next turn with a real clip; returns its job id."""
    job_id = await seed_turn(settings, guild.id, guild.channel.id, PLAYERS[0].id, done=True)
    async with db_session(settings) as session:
        story_id, seq = (await session.execute(select(Story.id, func.max(Turn.seq)).join(Turn))).one()
        turn_id = (await session.execute(select(Job.turn_id).where(Job.id == job_id))).scalar_one()
        await session.execute(update(Turn).where(Turn.id == turn_id).values(story_id=story_id, seq=seq + 1))
        key = (await session.execute(select(Turn.clip_key).where(Turn.id == turn_id))).scalar_one()
    game_store(settings).put_file(key, clip)
    return job_id


async def test_removing_a_clip_deletes_the_posted_recap_and_page_that_hold_it_and_the_kept_recap(
    double, bot_settings, tmp_path
):
    """A recap and a story page posted before an admin removes one of their clips: both messages go with it, and
    the kept recap object, which the next recap would otherwise have reused until the story moved on."""
    made = story_clips(tmp_path / "made", turns=3)
    async with running_bot(double, bot_settings):
        store = game_store(bot_settings)
        await begin_story(double)
        await add_finished_turns(bot_settings, made[:2])
        job_id = await story_turn_of_job(bot_settings, double.guild, made[2])
        await (await double.slash("story recap", user=PLAYERS[2])).followups(timeout=60)
        await (await double.slash("story page", user=PLAYERS[2])).followups(timeout=60)
        assert posted_with(double, ".mp4") and posted_with(double, ".html") and kept_recaps(store)
        handle = await double.slash("admin reports remove", {"job": job_id}, user=double.guild.owner)
        said = private_text(await handle.answer())
        await double.wait_until(lambda: not posted_with(double, ".mp4"), 10, "the recap message to be deleted")
    assert not posted_with(double, ".html")
    assert not kept_recaps(store)
    assert "2 recap or story page message(s) that held it are deleted too" in said


async def test_a_recap_message_discord_would_not_delete_goes_on_a_later_try(double, bot_settings, tmp_path):
    settings = bot_settings.model_copy(update={"retention_interval_seconds": 1})
    async with running_bot(double, settings):
        await begin_story(double)
        await add_finished_turns(settings, story_clips(tmp_path / "made", turns=2))
        await (await double.slash("story recap", user=PLAYERS[2])).followups(timeout=60)
        (recap,) = posted_with(double, ".mp4")
        refused = double.fail("DELETE", rf"/channels/\d+/messages/{recap.id}", status=503, times=1)
        purge = await double.slash("admin purge", {"user": PLAYERS[1]}, user=double.guild.owner)
        said = private_text(await purge.answer())
        await double.wait_until(lambda: not posted_with(double, ".mp4"), 30, "the recap message to be deleted")
    assert refused.hits == 1
    assert "0 recap or story page message(s) that held them" in said  # never "deleted" while it is still up
    assert "1 more recap or story page message(s) will be deleted on a later try" in said


async def test_a_recap_asked_for_again_within_the_cooldown_is_refused_saying_when(double, bot_settings, tmp_path):
    settings = bot_settings.model_copy(update={"recap_cooldown_seconds": 600})
    async with running_bot(double, settings):
        await begin_story(double)
        await add_finished_turns(settings, story_clips(tmp_path / "made", turns=2))
        asked = time.time()
        await (await double.slash("story recap", user=PLAYERS[2])).followups(timeout=60)
        text = private_text(await (await double.slash("story recap", user=PLAYERS[1])).answer())
    (when,) = re.findall(r"<t:(\d+):R>", text)
    assert "ask again" in text and "\n" not in text
    assert asked + 590 < int(when) <= time.time() + 602


async def test_other_commands_answer_while_a_recap_is_being_made(double, bot_settings, tmp_path):
    clips = story_clips(tmp_path / "made", turns=12)
    limit = sum(path.stat().st_size for path in clips) // 3  # so the joined clip is re-encoded, for seconds
    settings = bot_settings.model_copy(update={"upload_limit_bytes": limit})
    async with running_bot(double, settings):
        await begin_story(double)
        await add_finished_turns(settings, clips)
        recap = await double.slash("story recap", user=PLAYERS[2])
        assert (await recap.response()).json["type"] == 5  # deferred: the clip is being made
        meanwhile = private_text(await (await double.slash("story recap", user=PLAYERS[1])).answer())
        choices = await (await double.autocomplete("start", "character", "qi", user=PLAYERS[0])).choices()
        posted_meanwhile = double.calls_to("POST", rf"/webhooks/\d+/{re.escape(recap.token)}.*")
        (followup,) = await recap.followups(timeout=120)
    assert "being made" in meanwhile
    assert [c["value"] for c in choices] == ["Qiqi"]
    assert posted_meanwhile == []  # both answers came while the recap was still being encoded
    assert len(recap_clip(followup)) <= limit
    assert decoded_frames(recap_clip(followup)) == 12 * FRAMES


async def test_a_recap_too_large_to_attach_still_posts_the_summary_and_says_why(double, bot_settings, tmp_path):
    settings = bot_settings.model_copy(update={"upload_limit_bytes": 1000})
    async with running_bot(double, settings):
        await begin_story(double)
        await add_finished_turns(settings, story_clips(tmp_path / "made", turns=2))
        (followup,) = await (await double.slash("story recap", user=PLAYERS[2])).followups(timeout=60)
    text = followup.json["content"]
    assert "step 1" in text and "step 2" in text
    assert "too large to attach" in text
    assert not followup.files


async def test_end_archives_the_story_and_frees_the_channel(double, bot_settings):
    async with running_bot(double, bot_settings):
        await begin_story(double)
        await (await double.slash("story end", user=PLAYERS[0])).answer()
        again = await double.slash("story start", {"title": "Sequel"}, user=PLAYERS[0])
        assert "Sequel" in shown(await again.answer())["content"]
    assert sorted(s for (s,) in await read_db(bot_settings, select(Story.status))) == ["active", "archived"]


@pytest.mark.slow
async def test_a_story_turn_taken_while_the_one_before_renders_waits_for_it_and_carries_it(
    double, worker_settings, sqlite_worker, tiny_pipeline
):
    async with running_bot(double, worker_settings, sqlite_worker):
        await begin_story(double)
        await set_history_window(worker_settings, 2)
        for player, (motion, background) in zip(PLAYERS[:2], MOVES[:2], strict=True):  # back to back
            await accepted(await double.slash("story act", {"motion": motion, "background": background}, user=player))
        await wait_for_db(
            worker_settings, select(Job.result_message_id), lambda r: len(r) == 2 and all(x for (x,) in r)
        )

    jobs = await read_db(worker_settings, select(Job.sent_at, Job.finished_at, Job.result_message_id).order_by(Job.id))
    assert jobs[1][0] >= jobs[0][1]  # Bob's turn was sent only once Alice's was done
    assert jobs[0][2] < jobs[1][2]  # and the story's posts came in its order
    (alice, _), (bob, _) = await read_db(
        worker_settings, select(Turn, Job.id).join(Job).order_by(Turn.seq).options(undefer(Turn.representation))
    )
    past = [history_turn(alice)]
    expected = tiny_pipeline(TurnRequest(job_id="check", instruction=bob.instruction, seed=bob.seed, history=past))
    assert expected.representation == bob.representation


@pytest.mark.slow
async def test_reroll_and_continue_under_a_turn_of_an_ended_story_are_refused_in_one_sentence(
    double, worker_settings, sqlite_worker
):
    async with running_bot(double, worker_settings, sqlite_worker):
        await begin_story(double)
        await story_turn(double, worker_settings, PLAYERS[0], *MOVES[0], done=1)
        ((job_id, message_id),) = await read_db(worker_settings, select(Job.id, Job.result_message_id))
        await (await double.slash("story end", user=PLAYERS[0])).answer()
        reroll = await double.button(message_id, f"ag:turn:{job_id}:reroll", user=PLAYERS[0])
        text = private_text(await reroll.answer())
        click = await double.button(message_id, f"ag:turn:{job_id}:continue", user=PLAYERS[0])
        form = (await click.response()).json["data"]
        box = form["components"][0]["components"][0]["custom_id"]
        sent = await double.modal_submit(
            form["custom_id"], {box: "Character: Qiqi; Motion: wave; Background: town."}, user=PLAYERS[0]
        )
        again = private_text(await sent.answer())
    assert "story has ended" in text and "\n" not in text
    assert "story has ended" in again
    assert len(await read_db(worker_settings, select(Job.id))) == 1


@pytest.mark.slow
async def test_a_player_who_starts_over_leaves_the_story_whole_as_a_former_player(
    double, worker_settings, sqlite_worker
):
    async with running_bot(double, worker_settings, sqlite_worker):
        await begin_story(double)
        await story_turn(double, worker_settings, PLAYERS[0], *MOVES[0], done=1)
        await story_turn(double, worker_settings, PLAYERS[1], *MOVES[1], done=2)
        ask = await double.slash("reset", user=PLAYERS[0])
        buttons = [c for row in (await ask.response()).json["data"]["components"] for c in row["components"]]
        confirm = next(b for b in buttons if b["label"] == "Start over")
        await (await double.button(ask.original, confirm["custom_id"], user=PLAYERS[0])).response()
        await wait_for_db(worker_settings, select(Turn.character_id).order_by(Turn.seq), lambda r: r[0][0] is None)
        recap = await double.slash("story recap", user=PLAYERS[2])
        (followup,) = await recap.followups(timeout=60)
    assert len(await read_db(worker_settings, select(Turn.id).where(Turn.story_id.is_not(None)))) == 2
    text = followup.json["content"]
    assert "a former player" in text and "Sosuke" in text
