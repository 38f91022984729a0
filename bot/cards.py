"""The state card: an embed plus a small gauge picture, what the release's app shows as bars after each turn.

Discord embeds cannot draw coloured bars, so the three stats are drawn into a PNG that the caller attaches as
`GAUGE_FILENAME`; the embed points at it with an `attachment://` URL and repeats the numbers as text for screen readers
and for clients that do not load images.
"""

from __future__ import annotations

import io
import logging
import re
import time
from functools import cache

import discord
from PIL import Image, ImageDraw, ImageFont

from game.contract import Progress, Stage
from game.state import STAT_MAX, STAT_STEP, CharacterState, StateDeltas, stat_colour

logger = logging.getLogger(__name__)

GAUGE_FILENAME = "state.png"
GAUGE_SIZE = (480, 150)  # width, height: small enough to sit under the clip without dominating it
ROW_HEIGHT = GAUGE_SIZE[1] // 3
BAR_LEFT, BAR_WIDTH, BAR_HEIGHT = 140, 220, 20  # the filled part of a bar starts at BAR_LEFT
STATS = ("stamina", "social", "entertainment")  # the order the release's table lists them

BACKGROUND = (43, 45, 49)  # Discord's dark theme, so the card does not look pasted on
TRACK = (70, 73, 80)  # the unfilled rest of a bar
TEXT = (235, 236, 238)
# Discord's own red/yellow/green, readable on the dark background.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (237, 66, 69),
    "yellow": (254, 231, 92),
    "green": (87, 242, 135),
}

NAME_LIMIT = 100  # escaping at most doubles it, well inside Discord's 256-character title limit
INSTRUCTION_LIMIT = 300  # a turn's instruction is short; anything longer is cut so the card stays a card
FOOTER_LIMIT = 200


@cache
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    # Pillow's bundled default font: no font file to ship or find on the host.
    return ImageFont.load_default(size=size)


def _change(delta: int) -> str:
    """A delta as the change a player sees on the 0..100 scale (the model predicts units of STAT_STEP)."""
    return f"{STAT_STEP * delta:+d}"


def render_gauges(state: CharacterState, deltas: StateDeltas | None = None) -> bytes:
    """PNG bytes of the three stat bars; the same input gives the same bytes, so retries re-upload nothing new."""
    image = Image.new("RGB", GAUGE_SIZE, BACKGROUND)
    draw = ImageDraw.Draw(image)
    text_font = font(16)
    for row, stat in enumerate(STATS):
        value: int = getattr(state, stat)
        middle = row * ROW_HEIGHT + ROW_HEIGHT // 2
        top, bottom = middle - BAR_HEIGHT // 2, middle + BAR_HEIGHT // 2 - 1
        draw.text((12, middle), stat, fill=TEXT, font=text_font, anchor="lm")
        draw.rectangle((BAR_LEFT, top, BAR_LEFT + BAR_WIDTH - 1, bottom), fill=TRACK)
        filled = round(BAR_WIDTH * value / STAT_MAX)
        if filled > 0:
            draw.rectangle((BAR_LEFT, top, BAR_LEFT + filled - 1, bottom), fill=COLOURS[stat_colour(value)])
        label = str(value) if deltas is None else f"{value} ({_change(getattr(deltas, stat))})"
        draw.text((BAR_LEFT + BAR_WIDTH + 12, middle), label, fill=TEXT, font=text_font, anchor="lm")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def plain(text: str, limit: int) -> str:
    """Player text rendered as typed: no markdown, and no mention that pings or renders as one.

    escape_mentions only breaks @everyone, @here and 17-20 digit ids, so every remaining `@` gets the same zero-width
    space: an instruction such as `<@123>` must not show as a mention either.
    """
    if len(text) > limit:
        text = text[: limit - 1] + "…"  # cut before escaping, so no escape is cut in half
    text = discord.utils.escape_mentions(discord.utils.escape_markdown(text))
    return re.sub("@(?!\u200b)", "@\u200b", text)


def state_embed(
    character_name: str,
    state: CharacterState,
    *,
    instruction: str | None = None,
    deltas: StateDeltas | None = None,
    label: str = "",
    turn_number: int | None = None,
) -> discord.Embed:
    """The embed posted with each clip; attach `render_gauges(...)` as `GAUGE_FILENAME` for its image to show."""
    lowest = min(getattr(state, stat) for stat in STATS)
    red, green, blue = COLOURS[stat_colour(lowest)]
    embed = discord.Embed(
        title=plain(character_name, NAME_LIMIT),
        description=plain(instruction, INSTRUCTION_LIMIT) if instruction else None,
        colour=discord.Colour.from_rgb(red, green, blue),
    )
    for stat in STATS:
        value: int = getattr(state, stat)
        text = str(value) if deltas is None else f"{value} ({_change(getattr(deltas, stat))})"
        embed.add_field(name=stat, value=text, inline=True)
    if deltas is not None:
        embed.add_field(name="motion level", value=str(deltas.motion), inline=True)
    footer = [f"turn {turn_number}"] if turn_number is not None else []
    if label:
        footer.append(label)
    if footer:
        embed.set_footer(text=" · ".join(footer)[:FOOTER_LIMIT])
    embed.set_image(url=f"attachment://{GAUGE_FILENAME}")
    return embed


# -- progress messages: what a turn shows while it waits and runs (the commands and the supervisor both write it)

BAR_CELLS = 12


def queued_text(instruction: str, ahead: int, eta_seconds: float, *, after_story_turn: bool = False) -> str:
    if after_story_turn:
        return f"🎬 {instruction}\nQueued after the story's turn being made now."
    eta = int(time.time() + eta_seconds)
    place = "next in line" if ahead == 0 else f"{ahead} turn{'s' if ahead != 1 else ''} ahead"
    return f"🎬 {instruction}\nQueued, {place}; ready <t:{eta}:R>."


STAGE_WORDS = {
    Stage.LOADING: "Loading the model…",
    Stage.MLLM: "Imagining the turn…",
    Stage.VAE: "Rendering frames…",
    Stage.SAFETY: "Checking the clip…",
}


def progress_text(instruction: str, progress: Progress) -> str:
    if progress.stage is Stage.DENOISE and progress.total:
        filled = round(BAR_CELLS * progress.step / progress.total)
        bar = "▰" * filled + "▱" * (BAR_CELLS - filled)
        return f"🎬 {instruction}\nAnimating {bar} {100 * progress.step // progress.total}%"
    return f"🎬 {instruction}\n{STAGE_WORDS.get(progress.stage, 'Finishing the clip…')}"
