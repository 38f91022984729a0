"""/story page: the story so far as one self-contained HTML file, which a browser opens and plays."""

from __future__ import annotations

import base64
import io
import re

import av
import numpy as np
import pytest
from PIL import Image

from tests.bot.clip_samples import story_clips
from tests.bot.conftest import running_bot
from tests.bot.test_story import MOVES, NAMES, PLAYERS, add_finished_turns, begin_story, story_turn
from tests.chromium import CHROMIUM, MISSING, chromium
from tests.results import report

CLIP = re.compile(r'<video src="data:video/mp4;base64,([A-Za-z0-9+/=]+)"')
# Waits until every clip on the page is playing (or 10 s), then says what each shows.
PLAYING = """new Promise(done => {
  const started = Date.now();
  (function look() {
    const clips = [...document.querySelectorAll('video')];
    if ((clips.length && clips.every(v => v.currentTime > 0)) || Date.now() - started > 10000) {
      done(clips.map(v => {
        const box = v.getBoundingClientRect();
        return {width: v.videoWidth, time: v.currentTime, error: v.error && v.error.code,
                box: [box.x, box.y, box.width, box.height]};
      }));
    } else setTimeout(look, 100);
  })();
})"""


async def story_page_of_two_turns(double, settings) -> str:
    """Two turns played by the real worker, then /story page: the attached file's text."""
    await begin_story(double)
    for done, (player, (motion, background)) in enumerate(zip(PLAYERS[:2], MOVES[:2], strict=True), start=1):
        await story_turn(double, settings, player, motion, background, done)
    (followup,) = await (await double.slash("story page", user=PLAYERS[2])).followups(timeout=60)
    (page,) = [f for f in followup.files if f.filename.endswith(".html")]
    assert "2 turns" in followup.json["content"]
    return page.data.decode()


def frames_in(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


@pytest.mark.slow
async def test_the_page_holds_every_turn_with_its_player_changes_and_clip(double, worker_settings, sqlite_worker):
    async with running_bot(double, worker_settings, sqlite_worker):
        page = await story_page_of_two_turns(double, worker_settings)
    assert "Night flight" in page
    for name, (motion, background) in zip(NAMES[:2], MOVES[:2], strict=True):
        assert f"Character: {name}; Motion: {motion}; Background: {background}." in page
        assert f"<div class='muted'>{name}</div>" in page
    assert page.count("motion level") == 2 and page.count("stamina ") >= 2
    clips = [base64.b64decode(data) for data in CLIP.findall(page)]
    assert [frames_in(clip) for clip in clips] == [17, 17]  # each turn's own clip, inside the page
    assert 'src="http' not in page and "src='http" not in page  # nothing to fetch: it plays offline


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason=MISSING)
async def test_the_page_opens_in_a_browser_and_plays_its_clips(double, worker_settings, sqlite_worker, tmp_path):
    async with running_bot(double, worker_settings, sqlite_worker):
        page = await story_page_of_two_turns(double, worker_settings)
    (tmp_path / "story.html").write_text(page)
    async with chromium(tmp_path / "profile") as browser:
        await browser.open((tmp_path / "story.html").as_uri())
        clips = await browser.evaluate(PLAYING)
        shot = np.asarray(Image.open(io.BytesIO(await browser.screenshot())).convert("RGB")).astype(np.float32)

    assert [(clip["width"], clip["error"]) for clip in clips] == [(96, None), (96, None)]
    assert all(clip["time"] > 0 for clip in clips), clips  # playing, not just loaded
    background = shot[5, 5]  # the page's own colour, in a corner
    for clip in clips:
        x, y, w, h = (round(v) for v in clip["box"])
        shown = shot[y + 4 : y + h - 40, x + 4 : x + w - 4]  # the picture, above the player's controls
        assert shown.size and np.abs(shown - background).mean() > 10  # the clip's frames are drawn there
        assert shown.std() > 5  # a picture, not a blank box


async def test_a_page_too_large_for_every_clip_keeps_the_newest_and_says_so(double, bot_settings, tmp_path):
    clips = story_clips(tmp_path / "made", turns=4)
    newest = sum(len(base64.b64encode(clip.read_bytes())) for clip in clips[2:])
    settings = bot_settings.model_copy(update={"upload_limit_bytes": newest + 8_000})  # room for the newest two
    async with running_bot(double, settings):
        await begin_story(double)
        await add_finished_turns(settings, clips)
        (followup,) = await (await double.slash("story page", user=PLAYERS[2])).followups(timeout=60)
    (page,) = [f for f in followup.files if f.filename.endswith(".html")]
    text = page.data.decode()
    assert len(page.data) <= settings.upload_limit_bytes
    assert all(f"step {seq}" in text for seq in range(1, 5))  # every turn is on the page
    assert [frames_in(base64.b64decode(c)) > 0 for c in CLIP.findall(text)] == [True, True]
    assert text.index("step 2") < text.index("clip not included", text.index("step 2")) < text.index("step 3")
    assert "2 oldest clips did not fit" in followup.json["content"]


async def test_a_clip_the_servers_policy_withholds_here_stays_off_the_page(double, bot_settings, tmp_path):
    """A flagged clip (posted, say, while the channel was age-restricted) is not carried where it may not be posted
    now; its turn's text stays."""
    clean, flagged = report(BUTTOCKS_EXPOSED=0.01), report(BUTTOCKS_EXPOSED=0.9)
    async with running_bot(double, bot_settings):
        await begin_story(double)
        await add_finished_turns(bot_settings, story_clips(tmp_path / "made", turns=2), safety=[clean, flagged])
        (followup,) = await (await double.slash("story page", user=PLAYERS[2])).followups(timeout=60)
    (page,) = [f for f in followup.files if f.filename.endswith(".html")]
    text = page.data.decode()
    assert "step 1" in text and "step 2" in text
    assert len(CLIP.findall(text)) == 1
