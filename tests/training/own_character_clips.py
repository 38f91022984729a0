"""Clips of a character as a user brings them: toy-world episodes of Tombo rendered to MP4 files, with the
``annotations.jsonl`` that describes each (motion, place, time and the toy world's state changes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from media.mp4 import encode_mp4
from training.own_clips import ANNOTATIONS
from training.toyworld import ACTIONS_BY_NAME, CHARACTERS_BY_NAME, CLIP, World, place_turn, render_clip
from training.toyworld import Turn as ToyTurn

NAME = "Tombo"  # drawn by the toy world, never seen by the tiny published tree
EPISODES = (  # (action, adverb, place, time) a turn
    (
        ("run", "quickly", "street", "day"),
        ("sit down", "slowly", "street", "day"),
        ("wave to a friend", "gently", "street", "evening"),
    ),
    (("walk", "slowly", "grass", "morning"), ("jump", "rapidly", "grass", "day")),
    (("dance", "smoothly", "town", "night"), ("lie down", "slowly", "bedroom", "night")),
)


def render_clips(folder: Path, episodes: tuple = EPISODES) -> list[dict[str, object]]:
    """One MP4 a turn (17 frames at 8 fps, 64x96) and ``annotations.jsonl``; returns the annotation lines."""
    folder.mkdir(parents=True, exist_ok=True)
    character = CHARACTERS_BY_NAME[NAME]
    rng = np.random.default_rng(0)
    lines = []
    for e, episode in enumerate(episodes):
        world = World(character=character, layout_seed=100 + e)
        for t, (action, adverb, place, time) in enumerate(episode):
            turn = place_turn(ToyTurn(NAME, action, adverb, place, time))
            frames = render_clip(turn, world, rng, CLIP)  # (17, 64, 96, 3)
            name = f"tombo_{e}_{t}.mp4"
            (folder / name).write_bytes(encode_mp4(frames, CLIP.fps))
            phrase = ACTIONS_BY_NAME[action].phrases[0].format(prop=character.prop.name)
            deltas = turn.deltas
            lines.append(
                {
                    "file": name,
                    "start": 0,
                    "end": (CLIP.frames - 1) / CLIP.fps,
                    "character": NAME,
                    "adverb": adverb,
                    "motion": phrase,
                    "background": place,
                    "time": time,
                    "ML": deltas.motion,
                    "SC": deltas.social,
                    "ET": deltas.entertainment,
                    "ST": deltas.stamina,
                    "episode": f"episode {e}",
                }
            )
    (folder / ANNOTATIONS).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines
