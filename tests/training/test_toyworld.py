"""The toy world: its written state rules, its instructions, and what its renderer draws."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from game.instruction import ADVERBS as GRAMMAR_ADVERBS
from game.instruction import from_fields, parse
from game.state import DELTA_MAX, DELTA_MIN
from game.suggestions import TOY_VOCABULARY
from training.toyworld import (
    ACTIONS,
    ADVERBS,
    ADVERBS_BY_NAME,
    CHARACTERS,
    CHARACTERS_BY_NAME,
    CLIP,
    PLACES,
    PLACES_BY_NAME,
    TIMES_BY_NAME,
    TIMES_OF_DAY,
    Turn,
    World,
    allowed_actions,
    character_mask,
    figure_mask,
    plan_episode,
    render_background,
    render_clip,
    state_deltas,
    suggestions,
)

QIQI = CHARACTERS_BY_NAME["Qiqi"]
EVERY_CONTEXT = list(itertools.product(ADVERBS, PLACES, TIMES_OF_DAY))


def deltas_everywhere(action: str) -> list:
    return [state_deltas(action, adverb.name, place.name, time.name) for adverb, place, time in EVERY_CONTEXT]


def clip_of(action: str, adverb: str = "smoothly", place: str = "countryside", time: str = "day", x: float = 30.0):
    turn = Turn("Qiqi", action, adverb, place, time, start_x=x, facing=1)
    return render_clip(turn, World(QIQI, layout_seed=7), np.random.default_rng(0))


def centroid(frame: np.ndarray) -> np.ndarray:
    """(row, column) of Qiqi's body colour in one frame."""
    rows, cols = np.nonzero(figure_mask(frame, QIQI))
    assert rows.size, "Qiqi's body is not in the frame"
    return np.array([rows.mean(), cols.mean()])


def test_running_costs_stamina():
    assert all(d.stamina < 0 for d in deltas_everywhere("run"))


def test_lying_down_restores_stamina():
    assert all(d.stamina > 0 for d in deltas_everywhere("lie down"))


def test_waving_to_someone_raises_social():
    assert all(d.social > 0 for d in deltas_everywhere("wave to a friend"))


@pytest.mark.parametrize("action", ["jump", "fly on broomstick", "dance"])
def test_play_raises_entertainment(action):
    assert all(d.entertainment > 0 for d in deltas_everywhere(action))


def test_every_delta_is_within_minus_five_to_five():
    for action in ACTIONS:
        for d in deltas_everywhere(action.name):
            values = (d.motion, d.social, d.entertainment, d.stamina)
            assert all(DELTA_MIN <= v <= DELTA_MAX for v in values), (action.name, d)


def test_quicker_adverbs_have_higher_motion_levels():
    levels = [state_deltas("walk", adverb.name, "town", "day").motion for adverb in ADVERBS]
    assert levels == [1, 2, 3, 4, 5]
    assert ADVERBS_BY_NAME["quickly"].level > ADVERBS_BY_NAME["smoothly"].level > ADVERBS_BY_NAME["gently"].level
    assert {adverb.name for adverb in ADVERBS} <= GRAMMAR_ADVERBS


def test_every_instruction_is_in_the_animegamer_form():
    assert str(Turn("Qiqi", "fly on broomstick", "quickly", "sky", "day").instruction) == (
        "Character: Qiqi; Motion: quickly fly on broomstick; Background: day sky."
    )
    for character, place, time in itertools.product(CHARACTERS, PLACES, TIMES_OF_DAY):
        for action in allowed_actions(character, place):
            for phrase in action.phrases:
                instruction = Turn(character.name, action.name, "gently", place.name, time.name, phrase).instruction
                assert parse(str(instruction)) == instruction
                assert "{" not in str(instruction)


def test_rendering_is_deterministic_for_a_seed_and_has_the_clip_size():
    turn = Turn("Sosuke", "walk", "gently", "town", "evening")
    world = World(CHARACTERS_BY_NAME["Sosuke"], layout_seed=3)
    first = render_clip(turn, world, np.random.default_rng(11))
    assert first.shape == (CLIP.frames, CLIP.height, CLIP.width, 3) == (17, 64, 96, 3)
    assert first.dtype == np.uint8
    assert np.array_equal(first, render_clip(turn, world, np.random.default_rng(11)))


def test_night_is_darker_than_day_in_every_place():
    for place in PLACES:
        day = np.asarray(render_background(place, TIMES_BY_NAME["day"], 5)).mean()
        night = np.asarray(render_background(place, TIMES_BY_NAME["night"], 5)).mean()
        assert night < 0.6 * day, place.name


def test_no_scenery_has_a_characters_body_colour():
    """The figure is found by its exact colour, so no place at any time may contain it."""
    for place, time, seed in itertools.product(PLACES, TIMES_OF_DAY, range(3)):
        scene = np.asarray(render_background(place, time, seed))
        for character in CHARACTERS:
            assert not figure_mask(scene, character).any(), (place.name, time.name, character.name)


def test_flying_goes_up_and_across():
    clip = clip_of("fly on broomstick", place="sky")
    (row0, col0), (row1, col1) = centroid(clip[0]), centroid(clip[-1])
    assert row1 < row0 - 10  # up
    assert col1 > col0 + 10  # across, the way Qiqi faces


def test_lying_down_ends_lower_and_wider():
    clip = clip_of("lie down", place="grass")
    first, last = character_mask(clip[0], QIQI, grow=0), character_mask(clip[-1], QIQI, grow=0)
    assert centroid(clip[-1])[0] > centroid(clip[0])[0] + 3

    def extent(mask: np.ndarray, axis: int) -> int:
        return int(np.ptp(np.nonzero(mask)[axis]))

    assert extent(last, 1) > extent(first, 1)  # wider
    assert extent(last, 0) < extent(first, 0)  # and flatter


@pytest.mark.parametrize("action", ["walk", "run", "fly on broomstick", "jump"])
def test_quickly_moves_more_than_gently(action):
    def travel(adverb: str) -> float:
        clip = clip_of(action, adverb=adverb, x=20.0)
        return float(sum(np.linalg.norm(centroid(b) - centroid(a)) for a, b in itertools.pairwise(clip)))

    assert travel("quickly") > 1.5 * travel("gently")


@pytest.mark.parametrize("seed", range(6))
def test_a_character_keeps_its_colours_and_world_across_an_episode(seed):
    world, turns = plan_episode(np.random.default_rng(seed), 5)
    others = [c for c in CHARACTERS if c is not world.character]
    for index, turn in enumerate(turns):
        clip = render_clip(turn, world, np.random.default_rng(index))
        assert turn.character == world.character.name
        assert figure_mask(clip, world.character).any(axis=(1, 2)).all(), f"turn {index + 1} loses the figure"
        assert not any(figure_mask(clip, other).any() for other in others)
    for earlier, later in itertools.pairwise(turns):
        assert TIMES_BY_NAME[later.time].order >= TIMES_BY_NAME[earlier.time].order
        assert later.place in (earlier.place, *PLACES_BY_NAME[earlier.place].neighbours)


def test_the_character_fills_much_of_the_frame_and_stays_in_it():
    """The subject, as in AnimeGamer's clips: standing it is over half the frame's height, its body several of the
    VAE's 8-pixel latent cells across, and no action at any speed takes its body out of the frame."""
    for character in CHARACTERS:
        standing = render_clip(
            Turn(character.name, "wave to a friend", "gently", "town", "day"),
            World(character, 1),
            np.random.default_rng(0),
        )
        rows = np.nonzero(character_mask(standing[0], character, grow=0).any(axis=1))[0]
        assert np.ptp(rows) > 0.6 * CLIP.height, character.name
        cols = np.nonzero(figure_mask(standing[0], character).any(axis=0))[0]
        assert np.ptp(cols) >= 2 * 8, character.name  # at least two latent cells of body
        for place in PLACES:
            for action, adverb in itertools.product(allowed_actions(character, place), ("slowly", "rapidly")):
                turn = Turn(character.name, action.name, adverb, place.name, "day")
                body = figure_mask(render_clip(turn, World(character, 2), np.random.default_rng(3)), character)
                assert body.any(axis=(1, 2)).all(), (character.name, place.name, action.name, adverb)
                edges = body[:, 0].any() or body[:, -1].any() or body[:, :, 0].any() or body[:, :, -1].any()
                assert not edges, (character.name, place.name, action.name, adverb)


def test_the_camera_pans_with_a_figure_that_travels():
    """Quick travel shows as scenery streaming past: the sky band moves further than the figure crosses."""
    clip = clip_of("walk", adverb="smoothly", place="street", x=8.0)
    band = clip[:, :8].astype(np.int16)  # the rows above the walker's head: houses and sky only

    def mismatch(shift: int) -> float:  # the last frame's band against the first's moved ``shift`` to the left
        return float(np.abs(band[0][:, shift:] - band[-1][:, : CLIP.width - shift]).mean())

    scenery = min(range(CLIP.width // 2), key=mismatch)
    figure = centroid(clip[-1])[1] - centroid(clip[0])[1]
    assert mismatch(scenery) < 0.25 * mismatch(0)
    assert scenery > figure > 8  # pixels: both move, the scenery more (the camera follows)


def test_the_character_mask_covers_the_figure_and_none_of_an_empty_scene():
    clip = clip_of("walk")
    assert (character_mask(clip, QIQI) >= figure_mask(clip, QIQI)).all()
    assert character_mask(clip, QIQI).mean() > 2 * figure_mask(clip, QIQI).mean()  # head, legs, broom, a margin
    assert not character_mask(
        np.asarray(render_background(PLACES_BY_NAME["sky"], TIMES_BY_NAME["night"], 7)), QIQI
    ).any()


def test_the_bots_suggestions_are_the_toy_worlds_vocabulary():
    """The bot reads the toy world's motions and backgrounds from a file (it never imports training/): the file must
    say what the world does. After changing the world: write ``suggestions()`` to game/data/toy_vocabulary.json."""
    shipped = json.loads(TOY_VOCABULARY.read_text())
    assert shipped == suggestions()
    assert all(from_fields("Qiqi", motion, place) for motion in shipped["motions"] for place in shipped["backgrounds"])
