"""The state card: gauge picture and embed."""

from __future__ import annotations

import io
import re

import pytest
from PIL import Image

from bot.cards import (
    BAR_LEFT,
    COLOURS,
    GAUGE_FILENAME,
    GAUGE_SIZE,
    ROW_HEIGHT,
    STATS,
    render_gauges,
    state_embed,
)
from game.state import CharacterState, StateDeltas

DELTAS = StateDeltas(motion=3, social=-1, entertainment=0, stamina=2)


def _open(png: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    return image.convert("RGB")


def test_gauges_are_a_png_of_the_card_size() -> None:
    assert _open(render_gauges(CharacterState(), DELTAS)).size == GAUGE_SIZE


@pytest.mark.parametrize(("value", "colour"), [(10, "red"), (45, "yellow"), (90, "green")])
def test_each_bar_is_filled_in_its_stats_colour(value: int, colour: str) -> None:
    image = _open(render_gauges(CharacterState(stamina=value, social=value, entertainment=value)))
    for row in range(len(STATS)):
        assert image.getpixel((BAR_LEFT + 3, row * ROW_HEIGHT + ROW_HEIGHT // 2)) == COLOURS[colour]


def test_gauges_are_deterministic() -> None:
    state = CharacterState(stamina=20, social=55, entertainment=75)
    assert render_gauges(state, DELTAS) == render_gauges(state, DELTAS)


def test_gauges_show_the_change_when_deltas_are_given() -> None:
    state = CharacterState()
    assert render_gauges(state, DELTAS) != render_gauges(state)


def test_the_instruction_renders_as_plain_text() -> None:
    instruction = "@everyone <@123> <@123456789012345678> @here **x**"
    embed = state_embed("Qiqi", CharacterState(), instruction=instruction)
    description = embed.description or ""
    assert not re.search("@(?!\u200b)", description), description  # every @ is broken by a zero-width space
    assert "**x**" not in description and r"\*\*x\*\*" in description


def test_the_embed_shows_name_stats_changes_motion_and_footer_label() -> None:
    state = CharacterState(stamina=60, social=45, entertainment=50)
    embed = state_embed("Qiqi", state, deltas=DELTAS, label="tiny model, random weights", turn_number=3)
    fields = {field.name: field.value for field in embed.fields}
    assert embed.title == "Qiqi"
    assert fields == {"stamina": "60 (+10)", "social": "45 (-5)", "entertainment": "50 (+0)", "motion level": "3"}
    assert embed.footer.text is not None and "tiny model, random weights" in embed.footer.text
    assert "turn 3" in embed.footer.text


def test_the_embed_colour_follows_the_lowest_stat() -> None:
    embed = state_embed("Qiqi", CharacterState(stamina=90, social=20, entertainment=70))
    assert embed.colour is not None and embed.colour.to_rgb() == COLOURS["red"]


def test_the_embed_shows_the_attached_gauges() -> None:
    embed = state_embed("Qiqi", CharacterState())
    assert embed.image.url == f"attachment://{GAUGE_FILENAME}"
    assert embed.footer.text is None
