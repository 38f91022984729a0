"""/story page: the story so far as one HTML file with its clips inside, for people who would rather look than
scroll. It is the page ``animegamer demo`` writes (``animegamer.story_page``), each clip carried in it as a
``data:`` URL, so the file plays anywhere on its own; the newest clips are kept when all of them would make
it too large to attach.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

from animegamer.story_page import StoryRow, embedded, render_story
from bot.clip_store import ClipStore
from db.jobs import turn_outcome
from db.models import Turn

log = logging.getLogger(__name__)


def story_page(
    title: str, turns: list[tuple[Turn, str]], clips: ClipStore, limit: int, shown: set[int]
) -> tuple[bytes, int]:
    """The page and how many clips (the oldest) were left out to keep it under ``limit`` bytes; only the clips of
    the turns in ``shown`` (the channel's safety rules allow them) are carried. Reads every clip file: call it off
    the event loop."""
    rows = [_row(turn, name) for turn, name in turns]
    budget = limit - len(_page(title, turns, rows)) - 1024  # the page without clips, and room for the tags
    left_out = 0
    for index in range(len(turns) - 1, -1, -1):  # newest first: those are the ones a late reader has not seen
        key = turns[index][0].clip_key if turns[index][0].id in shown else None
        if key is None or not clips.exists(key):  # none, or retention emptied it: the row stays, without a clip
            continue
        clip = "" if left_out else _clip(clips, key)
        if clip is None:  # gone since it was looked at
            continue
        if not clip or len(clip) > budget:
            left_out += 1  # and every older one, so the page keeps an unbroken run of the newest
            continue
        rows[index], budget = replace(rows[index], clip=clip), budget - len(clip) - 128
    return _page(title, turns, rows).encode(), left_out


def _page(title: str, turns: list[tuple[Turn, str]], rows: list[StoryRow]) -> str:
    newest = turns[-1][0] if turns else None
    model, label = (newest.model, newest.label or "") if newest else ("", "")
    return render_story(rows, title=title, model=model, label=label, status=f"{len(turns)} turns so far.")


def _row(turn: Turn, name: str) -> StoryRow:
    state, deltas = turn_outcome(turn)  # story_turns gives finished turns only
    seconds = sum(json.loads(turn.timings or "{}").values())
    return StoryRow(turn.seq or 0, turn.instruction, "", deltas, state, seconds, player=name)


def _clip(clips: ClipStore, key: str) -> str | None:
    try:
        return embedded(clips.get(key))
    except OSError as exc:
        log.info("story page: clip %s not read (%s)", key, exc)
        return None
