"""The story page warns about every untrained model's clips, by the label the worker gave them."""

from __future__ import annotations

import pytest

from animegamer.story_page import render_story
from game.contract import FULL_RANDOM_WEIGHTS_LABEL, RANDOM_WEIGHTS_LABEL
from worker.pipeline.config import full, tiny


@pytest.mark.parametrize("label", [RANDOM_WEIGHTS_LABEL, FULL_RANDOM_WEIGHTS_LABEL])
def test_random_weights_of_any_size_are_called_noise(label: str) -> None:
    page = render_story([], title="t", model="whatever the setting says", label=label, status="")
    assert "these clips are noise" in page


def test_trained_weights_get_no_warning() -> None:
    assert "noise" not in render_story([], title="t", model="animegamer", label="", status="")


def test_the_random_weight_presets_carry_the_labels_the_bot_and_page_show() -> None:
    assert (tiny().label, full().label) == (RANDOM_WEIGHTS_LABEL, FULL_RANDOM_WEIGHTS_LABEL)
