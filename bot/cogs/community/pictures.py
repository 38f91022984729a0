"""The profile and board pictures, drawn like the state card (``bot.cards``): counts as bars, numbers beside."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

from bot.cards import BACKGROUND, GAUGE_SIZE, TEXT, TRACK, font, render_gauges
from game.state import CharacterState

WIDTH = GAUGE_SIZE[0]
ROW = 30
LABEL_WIDTH, BAR_WIDTH, BAR_HEIGHT = 200, 180, 16
BAR = (88, 101, 242)  # Discord's blurple: a count, where the state card's colours say good or bad
MUTED = (150, 153, 160)


def profile_picture(
    name: str, state: CharacterState | None, turns: int, stories: int, favourites: list[tuple[str, int]]
) -> bytes:
    """The character's name and gauges, what the player did, and their favourite actions as bars."""
    gauges = Image.open(io.BytesIO(render_gauges(state))) if state is not None else None
    top = 44 + (gauges.height if gauges else 0)
    image = Image.new("RGB", (WIDTH, top + 2 * ROW + 34 + max(1, len(favourites)) * ROW + 10), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.text((12, 22), name, fill=TEXT, font=font(22), anchor="lm")
    if gauges:
        image.paste(gauges, (0, 44))
    for row, (what, value) in enumerate((("turns played", turns), ("stories joined", stories))):
        middle = top + row * ROW + ROW // 2
        draw.text((12, middle), what, fill=TEXT, font=font(16), anchor="lm")
        draw.text((LABEL_WIDTH, middle), str(value), fill=TEXT, font=font(16), anchor="lm")
    top += 2 * ROW
    draw.text((12, top + 17), "favourite actions", fill=MUTED, font=font(16), anchor="lm")
    _bars(draw, top + 34, favourites, empty="none yet")
    return _png(image)


def board_picture(title: str, players: list[tuple[str, int]], stories: list[tuple[str, int]]) -> bytes:
    """Two ranked lists, the most active players and stories, each bar as long as its turns allow."""
    sections = (("players", players), ("stories", stories))
    height = 44 + sum(34 + max(1, len(rows)) * ROW for _, rows in sections) + 10
    image = Image.new("RGB", (WIDTH, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.text((12, 22), title, fill=TEXT, font=font(22), anchor="lm")
    top = 44
    for heading, rows in sections:
        draw.text((12, top + 17), heading, fill=MUTED, font=font(16), anchor="lm")
        top = _bars(draw, top + 34, rows, empty="no turns this week")
    return _png(image)


def _bars(draw: ImageDraw.ImageDraw, top: int, rows: list[tuple[str, int]], empty: str) -> int:
    """One row per (label, count), bars scaled to the largest count; returns the y below the last row."""
    if not rows:
        draw.text((12, top + ROW // 2), empty, fill=MUTED, font=font(16), anchor="lm")
        return top + ROW
    most = max(count for _, count in rows)
    for index, (label, count) in enumerate(rows):
        middle = top + index * ROW + ROW // 2
        shown = label if len(label) <= 24 else label[:23] + "…"
        draw.text((12, middle), shown, fill=TEXT, font=font(16), anchor="lm")
        bar_top = middle - BAR_HEIGHT // 2
        draw.rectangle((LABEL_WIDTH, bar_top, LABEL_WIDTH + BAR_WIDTH - 1, bar_top + BAR_HEIGHT - 1), fill=TRACK)
        filled = max(1, round(BAR_WIDTH * count / most))
        draw.rectangle((LABEL_WIDTH, bar_top, LABEL_WIDTH + filled - 1, bar_top + BAR_HEIGHT - 1), fill=BAR)
        draw.text((LABEL_WIDTH + BAR_WIDTH + 12, middle), str(count), fill=TEXT, font=font(16), anchor="lm")
    return top + len(rows) * ROW


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
