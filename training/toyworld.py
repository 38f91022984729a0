"""The toy world: a procedurally drawn stand-in for AnimeGamer's anime training clips.

The three training phases need clips whose instruction, motion and state changes are known
exactly, and a CPU machine with no downloads. Everything here is plain data (characters with a
look and a prop, actions with a motion function, adverbs, places, times of day) plus written
state rules and a small Pillow renderer, deterministic for a seed.

Figures keep their exact colours at every time of day (only the scenery is lit), so a test or
a metric can find a character by its body colour, and a model must keep its identity across
turns. No background ever contains a character's body colour (tests check every place and time).

Framing, as in AnimeGamer's clips: the character is the subject. A figure is drawn ``FIGURE_SCALE``
times its height in units (about 44 of the clip's 64 rows), so the VAE's 8x8 latent cells see its
body several cells across, and the camera pans with it: of the distance a figure travels, the
camera takes ``FOLLOW`` and the figure crosses the frame by the rest, so quick travel shows as
scenery streaming past as well as the figure moving.

Coordinates: the clip is ``(frames, height, width, 3)`` uint8, the size of the ``tiny`` pipeline
(17 frames at 64x96). A figure is drawn in local units ``(u, v)``: ``u`` along its facing, ``v``
up from its feet; a ``Pose`` moves and bends it, and ``facing`` mirrors it. A pose's travel
``dx`` is in units too; its ``lift`` is in screen pixels (there is no vertical panning).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np
from PIL import Image, ImageDraw

from game.instruction import Instruction, from_fields
from game.state import DELTA_MAX, DELTA_MIN, StateDeltas
from worker.pipeline.config import tiny
from worker.pipeline.tokenizer import word_pieces

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class ClipSize:
    frames: int
    height: int
    width: int
    fps: int


_TINY = tiny()
CLIP = ClipSize(frames=_TINY.num_frames, height=_TINY.height, width=_TINY.width, fps=_TINY.fps)  # 17 x 64 x 96
FIGURE_SCALE = 2.2  # screen pixels per figure unit for a 20-unit character: 44 pixels tall, 2.75 latent cells wide
FOLLOW = 0.7  # the camera's share of a figure's travel; the figure crosses the frame by the other 0.3

# ---------------------------------------------------------------------------------------------
# Vocabulary: characters and their props


@dataclass(frozen=True)
class Prop:
    name: str  # the word an instruction uses: "hold broom"
    colour: RGB  # handle or stick
    detail: RGB  # bristles, canopy, pail
    rideable: bool = False  # only a broom can be flown on


BROOM = Prop("broom", colour=(139, 90, 43), detail=(222, 184, 92), rideable=True)
UMBRELLA = Prop("umbrella", colour=(90, 60, 40), detail=(250, 204, 40))
BUCKET = Prop("bucket", colour=(60, 60, 60), detail=(46, 170, 90))


@dataclass(frozen=True)
class Character:
    name: str
    shape: str  # "dress" (trapezoid), "shirt" (rectangle) or "round" (octagon)
    body: RGB  # unique in the world: tests and metrics find the figure by this colour
    skin: RGB
    hair: RGB
    legs: RGB
    accent: RGB  # a bow or a cap band on the hair
    prop: Prop
    height: float = 20.0  # feet to head top, in units (FIGURE_SCALE pixels each at height 20)


CHARACTERS: tuple[Character, ...] = (
    # The release's two characters first: Qiqi the witch with her broom, Sosuke with his bucket.
    Character(
        "Qiqi",
        "dress",
        body=(52, 28, 96),
        skin=(250, 214, 180),
        hair=(38, 22, 18),
        legs=(30, 30, 34),
        accent=(214, 30, 60),
        prop=BROOM,
    ),
    Character(
        "Sosuke",
        "shirt",
        body=(200, 36, 44),
        skin=(240, 196, 160),
        hair=(92, 58, 30),
        legs=(40, 70, 150),
        accent=(250, 250, 250),
        prop=BUCKET,
        height=18.0,
    ),
    Character(
        "Momo",
        "round",
        body=(236, 104, 172),
        skin=(255, 222, 196),
        hair=(250, 170, 60),
        legs=(120, 60, 40),
        accent=(120, 200, 255),
        prop=UMBRELLA,
        height=17.0,
    ),
    Character(
        "Tombo",
        "shirt",
        body=(18, 132, 142),
        skin=(230, 186, 150),
        hair=(20, 20, 24),
        legs=(90, 80, 60),
        accent=(255, 140, 0),
        prop=BROOM,
        height=21.0,
    ),
)
CHARACTERS_BY_NAME = MappingProxyType({character.name: character for character in CHARACTERS})

# ---------------------------------------------------------------------------------------------
# Vocabulary: adverbs, and how an action moves the figure


@dataclass(frozen=True)
class Adverb:
    name: str
    speed: float  # multiplies how far and how often the figure moves
    level: int  # the motion level (ML, 1..5) the model predicts; game.motion.flow_for maps it to the decoder
    effort: float  # multiplies what exertion costs and what play is worth


ADVERBS: tuple[Adverb, ...] = (
    Adverb("slowly", speed=0.4, level=1, effort=0.5),
    Adverb("gently", speed=0.6, level=2, effort=0.75),  # the release's demo: gently / smoothly / quickly
    Adverb("smoothly", speed=1.0, level=3, effort=1.0),
    Adverb("quickly", speed=1.5, level=4, effort=1.5),
    Adverb("rapidly", speed=2.0, level=5, effort=2.0),
)
ADVERBS_BY_NAME = MappingProxyType({adverb.name: adverb for adverb in ADVERBS})


@dataclass(frozen=True)
class Pose:
    """The figure in one frame, relative to where the clip starts."""

    dx: float = 0.0  # figure units travelled along the facing (the camera follows: see FOLLOW)
    lift: float = 0.0  # screen pixels above the floor
    lean: float = 0.0  # degrees towards the facing; 90 lies flat
    crouch: float = 0.0  # 0 standing, 1 seated: hips lowered, legs forward
    head: float = 1.0  # where the face looks: 1 forward, -1 back
    arm: float | None = None  # the front arm's angle above horizontal (radians); None hangs by the side
    stride: float = 0.0  # legs apart, -1..1 (walking)
    prop: str = "carried"  # "carried" at the side, "ridden" under the figure, "held" up in front


Motion = Callable[[float, float], Pose]  # (t in 0..1 over the clip, adverb speed) -> pose


def _ease(p: float) -> float:
    p = min(1.0, max(0.0, p))
    return p * p * (3 - 2 * p)


def _fly(t: float, s: float) -> Pose:
    travel, rise = min(36 * s, 50), min(8 + 6 * s, 18)
    bob = 1.5 * math.sin(2 * math.pi * 2 * t) * min(1.0, s)
    return Pose(dx=travel * t, lift=rise * t + bob * t, lean=10, crouch=0.8, arm=-0.5, prop="ridden")


def _walk(t: float, s: float) -> Pose:
    phase = 2 * math.pi * (2 + 2 * s) * t
    return Pose(dx=min(24 * s, 60) * t, lift=0.7 * abs(math.sin(phase)), stride=math.sin(phase))


def _run(t: float, s: float) -> Pose:
    phase = 2 * math.pi * (3 + 3 * s) * t
    swing = math.sin(phase)
    return Pose(dx=min(50 * s, 72) * t, lift=2.5 * abs(swing), lean=15, stride=1.3 * swing, arm=-0.3 + 0.5 * swing)


def _jump(t: float, s: float) -> Pose:
    lift = min(3 + 5 * s, 11) * 4 * t * (1 - t)
    squat = 0.4 * max(0.0, 1 - 8 * t) + 0.4 * max(0.0, 1 - 8 * (1 - t))
    return Pose(dx=min(8 * s, 16) * t, lift=lift, crouch=squat, arm=1.3 if lift > 2 else None)


def _dance(t: float, s: float) -> Pose:
    phase = 2 * math.pi * (1 + s) * t
    return Pose(
        dx=3 * s * math.sin(phase),
        lift=2 * s * abs(math.sin(2 * phase)),
        head=1.0 if math.sin(phase) >= 0 else -1.0,
        arm=1.0 + 0.5 * math.sin(2 * phase),
        stride=math.sin(phase),
    )


def _sit(t: float, s: float) -> Pose:
    return Pose(crouch=_ease(t * (0.8 + s)))


def _sit_on_railing(t: float, s: float) -> Pose:
    p = _ease(t * (0.8 + s))
    return Pose(lift=RAILING_HEIGHT * p, crouch=p)


def _lie_down(t: float, s: float) -> Pose:
    return Pose(lean=90 * _ease(t * (0.8 + s)))


def _turn_head(t: float, s: float) -> Pose:
    return Pose(head=math.cos(math.pi * _ease(t * (0.6 + s))))


def _wave(t: float, s: float) -> Pose:
    return Pose(arm=1.1 + (0.3 + 0.25 * s) * math.sin(2 * math.pi * (1 + 2 * s) * t))


def _hold(t: float, s: float) -> Pose:
    return Pose(lean=3 * s * math.sin(2 * math.pi * t), arm=0.3, prop="held")


RAILING_HEIGHT = 12  # pixels: the railing "sit on railing" draws and the figure climbs onto


@dataclass(frozen=True)
class Action:
    name: str  # the key; also the first phrase
    phrases: tuple[str, ...]  # how an instruction may say it; "{prop}" is the character's prop
    motion: Motion
    stamina: int  # base changes the state rules start from (state_deltas)
    social: int
    fun: int
    play: bool = False  # play is worth more the quicker it is
    places: frozenset[str] | None = None  # where it can happen; None: every place with a floor
    rideable: bool = False  # needs a prop that flies
    railing: bool = False  # the clip draws a railing to sit on


_OUTDOOR_FLOORS = frozenset({"countryside", "grass", "town", "street"})
ACTIONS: tuple[Action, ...] = (
    Action(
        "fly on broomstick",
        ("fly on broomstick", "flying on broomstick"),
        _fly,
        stamina=-2,
        social=0,
        fun=3,
        play=True,
        places=frozenset({"sky"}) | _OUTDOOR_FLOORS,
        rideable=True,
    ),
    Action("walk", ("walk", "walk along"), _walk, stamina=-1, social=0, fun=1),
    Action("run", ("run", "run around"), _run, stamina=-3, social=0, fun=1, places=_OUTDOOR_FLOORS),
    Action("jump", ("jump", "jump up"), _jump, stamina=-2, social=0, fun=3, play=True),
    Action("dance", ("dance",), _dance, stamina=-2, social=1, fun=4, play=True),
    Action("sit down", ("sit down",), _sit, stamina=2, social=0, fun=0),
    Action(
        "sit on railing",
        ("sit on railing",),
        _sit_on_railing,
        stamina=2,
        social=0,
        fun=1,
        places=frozenset({"town", "street", "countryside"}),
        railing=True,
    ),
    Action(
        "lie down",
        ("lie down",),
        _lie_down,
        stamina=4,
        social=0,
        fun=0,
        places=frozenset({"grass", "countryside", "bedroom"}),
    ),
    Action("turn head", ("turn head", "look around"), _turn_head, stamina=0, social=1, fun=1),
    Action("wave to a friend", ("wave to a friend", "wave hello"), _wave, stamina=0, social=3, fun=1),
    Action("hold prop", ("hold {prop}",), _hold, stamina=1, social=0, fun=0),
)
ACTIONS_BY_NAME = MappingProxyType({action.name: action for action in ACTIONS})

# ---------------------------------------------------------------------------------------------
# Vocabulary: times of day and places


@dataclass(frozen=True)
class TimeOfDay:
    name: str
    order: int  # an episode's time only moves forward
    sky_top: RGB
    sky_bottom: RGB
    light: tuple[float, float, float]  # multiplies the colours of ground and scenery outdoors
    indoor: tuple[float, float, float]  # the same in the bedroom (a lamp at night)
    lit_windows: bool  # town windows and street lamps glow
    stars: bool


TIMES_OF_DAY: tuple[TimeOfDay, ...] = (
    TimeOfDay("morning", 0, (150, 186, 232), (252, 214, 186), (0.95, 0.92, 0.88), (0.95, 0.93, 0.9), False, False),
    TimeOfDay("day", 1, (84, 150, 232), (184, 218, 246), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0), False, False),
    TimeOfDay("evening", 2, (64, 58, 128), (248, 146, 72), (0.85, 0.62, 0.5), (0.92, 0.78, 0.62), True, False),
    TimeOfDay("night", 3, (6, 10, 34), (26, 36, 82), (0.28, 0.3, 0.42), (0.5, 0.44, 0.38), True, True),
)
TIMES_BY_NAME = MappingProxyType({time.name: time for time in TIMES_OF_DAY})

Draw = Callable[[ImageDraw.ImageDraw, np.random.Generator, TimeOfDay, ClipSize], None]


@dataclass(frozen=True)
class Place:
    name: str
    horizon: int  # the row where the floor starts; the clip's height for open sky
    floor_y: int  # the row the figure's feet stand on
    ground: RGB  # daylight colour of the floor band
    draw: Draw  # the place's scenery, from a layout generator that is the same at every time of day
    neighbours: tuple[str, ...]  # where an episode may go next
    people: bool = False  # someone around to wave to
    indoor: bool = False

    @property
    def has_floor(self) -> bool:
        return self.horizon < CLIP.height


def _lit(colour: RGB, light: tuple[float, float, float]) -> RGB:
    return (round(colour[0] * light[0]), round(colour[1] * light[1]), round(colour[2] * light[2]))


def _celestial(
    draw: ImageDraw.ImageDraw, layout: np.random.Generator, time: TimeOfDay, size: ClipSize, horizon: int
) -> None:
    """Stars and moon at night, the sun by day, low and warm at either end of it."""
    stars = layout.integers(0, [size.width, max(1, horizon)], size=(_many(24, size), 2))
    glow = layout.integers(150, 256, size=len(stars))
    sun_x = int(layout.integers(10, size.width - 10))
    if time.stars:
        for (x, y), g in zip(stars, glow, strict=True):
            draw.point((int(x), int(y)), fill=(int(g), int(g), int(min(255, g + 20))))
        draw.ellipse([sun_x - 4, 4, sun_x + 4, 12], fill=(236, 234, 206))
    elif time.name == "day":
        draw.ellipse([sun_x - 5, 3, sun_x + 5, 13], fill=(255, 240, 168))
    else:
        low = max(6, horizon - 10)
        colour = (250, 150, 64) if time.name == "evening" else (255, 222, 170)
        draw.ellipse([sun_x - 5, low - 5, sun_x + 5, low + 5], fill=colour)


def _many(count: int, size: ClipSize) -> int:
    """``count`` things per frame width, over the whole (panned) scenery's width."""
    return max(1, round(count * size.width / CLIP.width))


def _clouds(
    draw: ImageDraw.ImageDraw,
    layout: np.random.Generator,
    time: TimeOfDay,
    size: ClipSize,
    count: int,
    top: int,
    bottom: int,
) -> None:
    for _ in range(_many(count, size)):
        x, y = int(layout.integers(0, size.width)), int(layout.integers(top, bottom))
        w, h = int(layout.integers(8, 18)), int(layout.integers(3, 6))
        draw.ellipse([x - w, y - h, x + w, y + h], fill=_lit((244, 244, 250), time.light))


def _draw_sky(draw: ImageDraw.ImageDraw, layout: np.random.Generator, time: TimeOfDay, size: ClipSize) -> None:
    _celestial(draw, layout, time, size, size.height)
    _clouds(draw, layout, time, size, 5, 8, size.height - 4)


def _draw_countryside(draw: ImageDraw.ImageDraw, layout: np.random.Generator, time: TimeOfDay, size: ClipSize) -> None:
    horizon = PLACES_BY_NAME["countryside"].horizon
    _celestial(draw, layout, time, size, horizon)
    _clouds(draw, layout, time, size, 2, 6, horizon - 16)
    for _ in range(_many(3, size)):  # rolling hills behind the fields
        x, w = int(layout.integers(0, size.width)), int(layout.integers(24, 44))
        draw.ellipse([x - w, horizon - 10, x + w, horizon + 14], fill=_lit((92, 150, 84), time.light))
    draw.rectangle([0, horizon, size.width, size.height], fill=_lit((128, 176, 74), time.light))
    for row in range(horizon + 4, size.height, 6):  # furrows
        draw.line([(0, row), (size.width, row)], fill=_lit((112, 158, 62), time.light))
    for _ in range(_many(3, size)):
        x = int(layout.integers(4, size.width - 4))
        draw.line([(x, horizon + 2), (x, horizon - 6)], fill=_lit((96, 64, 36), time.light), width=2)
        draw.ellipse([x - 5, horizon - 15, x + 5, horizon - 4], fill=_lit((44, 110, 52), time.light))


def _draw_grass(draw: ImageDraw.ImageDraw, layout: np.random.Generator, time: TimeOfDay, size: ClipSize) -> None:
    horizon = PLACES_BY_NAME["grass"].horizon
    _celestial(draw, layout, time, size, horizon)
    _clouds(draw, layout, time, size, 2, 4, horizon - 8)
    draw.rectangle([0, horizon, size.width, size.height], fill=_lit((96, 172, 72), time.light))
    blades = layout.integers(0, [size.width, size.height - horizon], size=(_many(60, size), 2))
    for x, y in blades:
        base = horizon + int(y)
        draw.line([(int(x), base), (int(x) + 1, base - 3)], fill=_lit((60, 130, 48), time.light))
    flowers = layout.integers(0, [size.width, size.height - horizon], size=(_many(12, size), 2))
    palette = ((250, 250, 240), (250, 220, 60), (230, 80, 80))
    for i, (x, y) in enumerate(flowers):
        draw.point((int(x), horizon + int(y)), fill=_lit(palette[i % 3], time.light))


def _houses(
    draw: ImageDraw.ImageDraw, layout: np.random.Generator, time: TimeOfDay, size: ClipSize, horizon: int, tall: bool
) -> None:
    walls = ((232, 214, 180), (204, 180, 150), (180, 196, 210), (222, 196, 196))
    x = int(layout.integers(-8, 0))
    while x < size.width:
        w = int(layout.integers(14, 22))
        h = int(layout.integers(22, 34) if tall else layout.integers(12, 20))
        wall = walls[int(layout.integers(0, len(walls)))]
        draw.rectangle([x, horizon - h, x + w - 1, horizon], fill=_lit(wall, time.light))
        if not tall:
            roof = (168, 64, 52) if layout.random() < 0.5 else (110, 80, 70)
            draw.polygon(
                [(x - 2, horizon - h), (x + w + 1, horizon - h), (x + w // 2, horizon - h - 8)],
                fill=_lit(roof, time.light),
            )
        lights = layout.random(size=16) < 0.6  # drawn at every time, so the layout stays the same
        for i, wy in enumerate(range(horizon - h + 3, horizon - 4, 6)):
            for j, wx in enumerate(range(x + 3, x + w - 4, 6)):
                lit = time.lit_windows and lights[(i * 3 + j) % 16]
                colour = (255, 214, 110) if lit else _lit((70, 90, 120), time.light)
                draw.rectangle([wx, wy, wx + 2, wy + 2], fill=colour)
        x += w + int(layout.integers(0, 4))


def _draw_town(draw: ImageDraw.ImageDraw, layout: np.random.Generator, time: TimeOfDay, size: ClipSize) -> None:
    horizon = PLACES_BY_NAME["town"].horizon
    _celestial(draw, layout, time, size, horizon - 20)
    _houses(draw, layout, time, size, horizon, tall=False)
    draw.rectangle([0, horizon, size.width, size.height], fill=_lit((156, 150, 140), time.light))
    for x in range(-4, size.width, 8):  # cobbles
        draw.line([(x, size.height), (x + 6, horizon)], fill=_lit((136, 130, 122), time.light))


def _draw_street(draw: ImageDraw.ImageDraw, layout: np.random.Generator, time: TimeOfDay, size: ClipSize) -> None:
    horizon = PLACES_BY_NAME["street"].horizon
    _celestial(draw, layout, time, size, horizon - 30)
    _houses(draw, layout, time, size, horizon, tall=True)
    draw.rectangle([0, horizon, size.width, size.height], fill=_lit((166, 164, 156), time.light))  # pavement
    road = horizon + 16
    draw.rectangle([0, road, size.width, size.height], fill=_lit((72, 72, 78), time.light))
    for x in range(0, size.width, 12):
        draw.line([(x, road + 4), (x + 5, road + 4)], fill=_lit((236, 236, 228), time.light))
    for x in range(0, size.width, 48):  # street lamps
        x += int(layout.integers(6, 30))
        draw.line([(x, horizon + 12), (x, horizon - 18)], fill=_lit((50, 50, 56), time.light), width=2)
        lamp = (255, 236, 150) if time.lit_windows else _lit((200, 200, 190), time.light)
        draw.ellipse([x - 3, horizon - 22, x + 3, horizon - 17], fill=lamp)


def _draw_bedroom(draw: ImageDraw.ImageDraw, layout: np.random.Generator, time: TimeOfDay, size: ClipSize) -> None:
    horizon = PLACES_BY_NAME["bedroom"].horizon
    draw.rectangle([0, 0, size.width, horizon], fill=_lit((232, 214, 184), time.indoor))  # wall
    draw.rectangle([0, horizon, size.width, size.height], fill=_lit((170, 118, 76), time.indoor))  # floor
    for row in range(horizon + 4, size.height, 5):
        draw.line([(0, row), (size.width, row)], fill=_lit((150, 100, 62), time.indoor))
    wx, bx = int(layout.integers(8, 30)), int(layout.integers(56, 66))
    stars = layout.integers(0, [20, 16], size=(5, 2))
    frame = _lit((250, 250, 250), time.indoor)
    first = (size.width - CLIP.width) // 2 % CLIP.width - CLIP.width  # one room per frame width, panned past
    for left in range(first, size.width, CLIP.width):
        x = left + wx
        window = [x, 8, x + 22, 26]  # the window shows the time of day outside
        draw.rectangle(window, fill=time.sky_top if time.stars else time.sky_bottom, outline=frame)
        draw.line([(x + 11, 8), (x + 11, 26)], fill=frame)
        if time.stars:
            for sx, sy in stars:
                draw.point((x + 1 + int(sx), 9 + int(sy)), fill=(230, 230, 240))
        x = left + bx
        draw.rectangle([x, horizon - 6, x + 28, horizon + 8], fill=_lit((120, 76, 46), time.indoor))  # bed
        draw.rectangle([x + 1, horizon - 8, x + 27, horizon + 2], fill=_lit((86, 120, 196), time.indoor))
        draw.rectangle([x + 20, horizon - 11, x + 27, horizon - 6], fill=_lit((246, 246, 240), time.indoor))
        if time.name == "night":  # a lamp on the bedside table
            draw.rectangle([x - 8, horizon - 8, x - 3, horizon + 4], fill=_lit((110, 70, 44), time.indoor))
            draw.polygon(
                [(x - 9, horizon - 9), (x - 2, horizon - 9), (x - 4, horizon - 14), (x - 7, horizon - 14)],
                fill=(255, 226, 150),
            )


PLACES: tuple[Place, ...] = (
    Place(
        "sky", horizon=64, floor_y=60, ground=(0, 0, 0), draw=_draw_sky, neighbours=("countryside", "town", "street")
    ),
    Place(
        "countryside",
        horizon=36,
        floor_y=60,
        ground=(128, 176, 74),
        draw=_draw_countryside,
        neighbours=("sky", "grass", "town"),
    ),
    Place("grass", horizon=30, floor_y=60, ground=(96, 172, 72), draw=_draw_grass, neighbours=("countryside", "town")),
    Place(
        "town",
        horizon=44,
        floor_y=61,
        ground=(156, 150, 140),
        draw=_draw_town,
        neighbours=("street", "countryside", "sky"),
        people=True,
    ),
    Place(
        "street",
        horizon=40,
        floor_y=60,
        ground=(166, 164, 156),
        draw=_draw_street,
        neighbours=("town", "bedroom", "sky"),
        people=True,
    ),
    Place(
        "bedroom",
        horizon=44,
        floor_y=61,
        ground=(170, 118, 76),
        draw=_draw_bedroom,
        neighbours=("street",),
        indoor=True,
    ),
)
PLACES_BY_NAME = MappingProxyType({place.name: place for place in PLACES})

# ---------------------------------------------------------------------------------------------
# The state rules


def _round(value: float) -> int:
    """Half away from zero, so a 1.5 stamina cost is 2 whichever its sign."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def _clamp(value: int) -> int:
    return max(DELTA_MIN, min(DELTA_MAX, value))


def state_deltas(action: str, adverb: str, place: str, time: str) -> StateDeltas:
    """The ground-truth state changes of one clip, by written rules (each rule is one line below)."""
    act, adv = ACTIONS_BY_NAME[action], ADVERBS_BY_NAME[adverb]
    where, when = PLACES_BY_NAME[place], TIMES_BY_NAME[time]
    stamina, social, fun = float(act.stamina), float(act.social), float(act.fun)
    night = when.name == "night"
    if act.stamina < 0:
        stamina *= adv.effort  # exertion (run -3, fly/jump/dance -2, walk -1) costs more the quicker it is done
        stamina -= 1 if night else 0  # exertion at night costs one more
    if act.stamina > 0:
        stamina += 1 if adv.level <= 2 else 0  # resting (lie down +4, sit +2, hold a prop +1) slowly or gently: +1
        stamina += 1 if where.indoor or night else 0  # rest in the bedroom or at night restores one more
    if act.social > 0:
        social += 1 if where.people else 0  # waving (+3) or looking around (+1) in town or street, among people: +1
    if act.play:
        fun *= adv.effort  # play (fly +3, jump +3, dance +4) is more fun the quicker it is
        fun += 1 if where.name == "sky" else 0  # flying in the open sky is one more
    return StateDeltas(
        motion=adv.level,  # the motion level is the adverb's: slowly 1 .. rapidly 5
        social=_clamp(_round(social)),
        entertainment=_clamp(_round(fun)),
        stamina=_clamp(_round(stamina)),
    )


# ---------------------------------------------------------------------------------------------
# A turn, a world, an episode plan


@dataclass(frozen=True)
class World:
    """What stays the same across an episode's turns: who, and how each place is laid out."""

    character: Character
    layout_seed: int


@dataclass(frozen=True)
class Turn:
    """One clip to draw: what happens, where and when, and where the figure starts."""

    character: str
    action: str
    adverb: str
    place: str
    time: str
    phrase: str = ""  # the action as the instruction words it; default: the action's first phrase
    start_x: float | None = None  # feet column at frame 0; None: the path centred in the frame (place_turn)
    facing: int | None = None  # 1 right, -1 left; None: right where the path fits (place_turn)

    @property
    def instruction(self) -> Instruction:
        phrase = self.phrase or ACTIONS_BY_NAME[self.action].phrases[0]
        prop = CHARACTERS_BY_NAME[self.character].prop.name
        return from_fields(self.character, f"{self.adverb} {phrase.format(prop=prop)}", f"{self.time} {self.place}")

    @property
    def deltas(self) -> StateDeltas:
        return state_deltas(self.action, self.adverb, self.place, self.time)


def allowed_actions(character: Character, place: Place) -> tuple[Action, ...]:
    """What this character can do here: the sky only allows riding, and only a broom flies."""
    return tuple(
        action
        for action in ACTIONS
        if (place.name in action.places if action.places is not None else place.has_floor)
        and (character.prop.rideable or not action.rideable)
    )


def allowed_places(character: Character) -> tuple[Place, ...]:
    return tuple(place for place in PLACES if allowed_actions(character, place))


def poses(turn: Turn, size: ClipSize = CLIP) -> list[Pose]:
    """The figure's pose in every frame, relative to its start."""
    action, adverb = ACTIONS_BY_NAME[turn.action], ADVERBS_BY_NAME[turn.adverb]
    return [action.motion(i / (size.frames - 1), adverb.speed) for i in range(size.frames)]


def figure_scale(character: Character) -> float:
    """Screen pixels per figure unit for this character."""
    return FIGURE_SCALE * character.height / 20.0


def screen_dx(pose: Pose) -> float:
    """How far the figure has crossed the frame (pixels along its facing): its travel less the camera's."""
    return pose.dx * FIGURE_SCALE * (1.0 - FOLLOW)


def camera_dx(pose: Pose) -> float:
    """How far the camera has panned with the figure (pixels along its facing)."""
    return pose.dx * FIGURE_SCALE * FOLLOW


# The scenery is drawn this much wider on each side than the frame, enough for the longest pan (a rapid run).
PAN_MARGIN = math.ceil(72 * FIGURE_SCALE * FOLLOW) + 2


def _reach(pose: Pose, scale: float) -> tuple[float, float]:
    """How far the figure extends behind and ahead of its start column (screen pixels along the facing)."""
    lean = math.sin(math.radians(pose.lean))
    back = 16.0 if pose.prop == "ridden" else 6.0
    return screen_dx(pose) - back * scale, screen_dx(pose) + (6.0 + 18.0 * lean) * scale


def start_range(turn: Turn, facing: int, size: ClipSize = CLIP) -> tuple[float, float]:
    """The start columns that keep the whole figure inside the frame for the clip, for one facing."""
    margin = 2.0
    scale = figure_scale(CHARACTERS_BY_NAME[turn.character])
    reaches = [_reach(pose, scale) for pose in poses(turn, size)]
    offsets = [facing * r for pair in reaches for r in pair]
    return margin - min(offsets), size.width - margin - max(offsets)


def place_turn(turn: Turn, after: float | None = None, facing: int | None = None, size: ClipSize = CLIP) -> Turn:
    """Fix the start: continue from ``after`` (the previous turn's end) when it fits, else frame the path.

    A fresh start (no ``after``) faces right unless told otherwise and centres the figure's path in the frame,
    as a camera frames its subject: so the instruction alone says where the figure is, and only a turn that goes
    on in the same place needs the past to know it.
    """
    first = facing if facing else 1
    for candidate in (first, -first):
        low, high = start_range(turn, candidate, size)
        if low <= high:
            x = min(high, max(low, after)) if after is not None else (low + high) / 2
            return replace(turn, start_x=round(x, 2), facing=candidate)
    low, high = start_range(turn, first, size)  # too long a path for the frame: centre it
    return replace(turn, start_x=round((low + high) / 2, 2), facing=first)


def end_x(turn: Turn, size: ClipSize = CLIP) -> float:
    """The figure's column on screen at the clip's end."""
    assert turn.start_x is not None and turn.facing is not None, "place the turn first"
    return turn.start_x + turn.facing * screen_dx(poses(turn, size)[-1])


def plan_episode(rng: np.random.Generator, turns: int) -> tuple[World, list[Turn]]:
    """An episode of ``turns`` clips: one character, the same world, each turn a plausible next one.

    The place stays or moves to a neighbour (sky <-> countryside, street -> bedroom, ...), the time of
    day stays or moves forward, and the figure starts where it ended when the place stays.
    """
    assert 1 <= turns <= 5, f"an episode has 1..5 turns, got {turns}"
    character = CHARACTERS[int(rng.integers(len(CHARACTERS)))]
    world = World(character=character, layout_seed=int(rng.integers(2**31)))
    places = allowed_places(character)
    place = places[int(rng.integers(len(places)))]
    time = TIMES_OF_DAY[int(rng.integers(len(TIMES_OF_DAY)))]
    plan: list[Turn] = []
    for index in range(turns):
        if index:
            if rng.random() < 0.4 and time.order + 1 < len(TIMES_OF_DAY):
                time = TIMES_OF_DAY[time.order + 1]
            if rng.random() < 0.5:
                nearby = [p for p in (PLACES_BY_NAME[n] for n in place.neighbours) if p in places]
                place = nearby[int(rng.integers(len(nearby)))] if nearby else place
        actions = allowed_actions(character, place)
        action = actions[int(rng.integers(len(actions)))]
        adverb = ADVERBS[int(rng.integers(len(ADVERBS)))]
        phrase = action.phrases[int(rng.integers(len(action.phrases)))]
        turn = Turn(character.name, action.name, adverb.name, place.name, time.name, phrase=phrase)
        previous = plan[-1] if plan and plan[-1].place == place.name else None
        if previous is not None:  # the figure goes on from where it stopped, the way it faced
            turn = place_turn(turn, after=end_x(previous), facing=previous.facing)
        else:
            turn = place_turn(turn)
        plan.append(turn)
    return world, plan


def suggestions() -> dict[str, list[str]]:
    """Every motion and background this world's instructions say, in the order to offer them: each adverb's
    actions, then each time's places. ``game/data/toy_vocabulary.json`` holds it for the bot, which never imports
    training/ (``game.suggestions``)."""
    motions: dict[str, None] = {}
    for adverb in ADVERBS:
        for character in CHARACTERS:
            for place in allowed_places(character):
                for action in allowed_actions(character, place):
                    for phrase in action.phrases:
                        motions[f"{adverb.name} {phrase.format(prop=character.prop.name)}"] = None
    backgrounds = [f"{time.name} {place.name}" for time in TIMES_OF_DAY for place in PLACES]
    return {"motions": list(motions), "backgrounds": backgrounds}


def vocabulary() -> tuple[str, ...]:
    """Every word piece (``tokenizer.word_pieces``) of every instruction this world can give, sorted: the toy
    model's word list (``tokenizer.WordBase``); any other text still encodes, as bytes."""
    pieces: set[str] = set()
    for character in CHARACTERS:
        for place in allowed_places(character):
            for action in allowed_actions(character, place):
                for phrase, adverb, time in itertools.product(action.phrases, ADVERBS, TIMES_OF_DAY):
                    turn = Turn(character.name, action.name, adverb.name, place.name, time.name, phrase=phrase)
                    pieces.update(word_pieces(str(turn.instruction)))
    return tuple(sorted(pieces))


# ---------------------------------------------------------------------------------------------
# Drawing


def render_scenery(place: Place, time: TimeOfDay, layout_seed: int, size: ClipSize = CLIP) -> Image.Image:
    """The still scene the camera pans across: ``2 * PAN_MARGIN`` wider than a frame, a frame's height.

    A sky gradient for the time of day, the place's floor and scenery, lit by the time; the same layout at
    every time of day.
    """
    width = size.width + 2 * PAN_MARGIN
    rows = np.linspace(0.0, 1.0, max(1, place.horizon))[:, None]
    top, bottom = np.array(time.sky_top, float), np.array(time.sky_bottom, float)
    canvas = np.empty((size.height, width, 3), np.uint8)
    canvas[: place.horizon] = np.round(top + (bottom - top) * rows)[:, None, :][: size.height].astype(np.uint8)
    canvas[place.horizon :] = _lit(place.ground, time.light)
    image = Image.fromarray(canvas)
    layout = np.random.default_rng([layout_seed, PLACES.index(place)])  # the same layout at every time
    place.draw(ImageDraw.Draw(image), layout, time, replace(size, width=width))
    return image


def render_background(place: Place, time: TimeOfDay, layout_seed: int, size: ClipSize = CLIP) -> Image.Image:
    """What a frame shows behind the figure before the camera pans: the middle of ``render_scenery``."""
    return render_scenery(place, time, layout_seed, size).crop((PAN_MARGIN, 0, PAN_MARGIN + size.width, size.height))


def _draw_railing(draw: ImageDraw.ImageDraw, x: float, floor_y: int, light: tuple[float, float, float]) -> None:
    colour = _lit((110, 96, 84), light)
    top = floor_y - RAILING_HEIGHT
    draw.line([(x - 16, top), (x + 16, top)], fill=colour, width=2)
    for post in range(-16, 17, 8):
        draw.line([(x + post, top), (x + post, floor_y)], fill=colour)


def draw_figure(
    draw: ImageDraw.ImageDraw, character: Character, pose: Pose, x: float, floor_y: float, facing: int
) -> None:
    """One figure, its feet at column ``x``: legs, body in its colour, arms, head with hair and accent, its prop."""
    scale = figure_scale(character)
    lean = math.radians(pose.lean)
    cos, sin = math.cos(lean), math.sin(lean)
    base_x, base_y = x, floor_y - pose.lift
    lie = 5.5 * sin * scale  # lying flat, the body rests on its side, not half under the floor

    def at(u: float, v: float) -> tuple[float, float]:
        u, v = u * scale, v * scale
        return base_x + facing * (u * cos + v * sin), base_y - (v * cos - u * sin + lie)

    hip = 6.0 - 5.0 * pose.crouch
    shoulder = hip + 8.0
    walk = pose.stride * 2.5 * (1.0 - pose.crouch)
    for side, swing in ((-1.0, -walk), (1.0, walk)):  # seated, the legs point forward along the floor
        foot = (side * (1.0 - pose.crouch) + swing + 6.0 * pose.crouch, 0.0)
        draw.line([at(side, hip), at(*foot)], fill=character.legs, width=_width(2, scale))

    if pose.prop == "ridden":
        draw.line([at(-10, hip + 0.5), at(9, hip + 1.5)], fill=character.prop.colour, width=_width(2, scale))
        draw.polygon(
            [at(-10, hip + 2.5), at(-16, hip + 4), at(-16, hip - 2), at(-10, hip - 1)], fill=character.prop.detail
        )

    if character.shape == "dress":
        hem = hip - 2.0 * (1.0 - pose.crouch)  # seated, the skirt rests on the seat, not under the floor
        body = [at(-5, hem), at(5, hem), at(2.5, shoulder), at(-2.5, shoulder)]
    elif character.shape == "shirt":
        body = [at(-4.5, hip), at(4.5, hip), at(4.5, shoulder), at(-4.5, shoulder)]
    else:
        mid, rx, ry = (hip + shoulder) / 2, 4.5, 5.0
        body = [at(rx * math.cos(a), mid + ry * math.sin(a)) for a in np.linspace(0, 2 * math.pi, 8, endpoint=False)]
    draw.polygon(body, fill=character.body)

    back_hand = (-3.0 - walk * 0.5, shoulder - 6.0)
    draw.line([at(-1.5, shoulder - 1), at(*back_hand)], fill=character.skin, width=_width(1, scale))
    if pose.arm is None:
        hand = (3.0, shoulder - 6.0)
    else:
        hand = (1.5 + 6.0 * math.cos(pose.arm), shoulder - 1 + 6.0 * math.sin(pose.arm))
    draw.line([at(1.5, shoulder - 1), at(*hand)], fill=character.skin, width=_width(1, scale))

    head_u, head_v, radius = 0.6 * pose.head, shoulder + 4.0, 3.5 * scale
    cx, cy = at(head_u, head_v)
    draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=character.skin)
    hx, hy = at(head_u - 1.6 * pose.head, head_v + 1.0)
    hair = radius * 0.95
    draw.ellipse([hx - hair, hy - hair, hx + hair, hy + hair], fill=character.hair)
    ex, ey = at(head_u + 2.0 * pose.head, head_v + 0.3)
    draw.ellipse([ex - 0.5 * scale, ey - 0.5 * scale, ex + 0.5 * scale, ey + 0.5 * scale], fill=(20, 20, 20))
    ax, ay = at(head_u - 2.2 * pose.head, head_v + 3.0)
    draw.rectangle([ax - scale, ay - scale, ax + scale, ay + scale], fill=character.accent)

    if pose.prop != "ridden":
        _draw_prop(draw, character.prop, pose.prop, at, hand, _width(1, scale))


def _width(pixels: int, scale: float) -> int:
    """A line ``pixels`` wide on a 20-unit figure at scale 1, at this figure's scale."""
    return max(1, round(pixels * scale / 2))


def _draw_prop(
    draw: ImageDraw.ImageDraw,
    prop: Prop,
    mode: str,
    at: Callable[[float, float], tuple[float, float]],
    hand: tuple[float, float],
    width: int,
) -> None:
    hu, hv = hand
    if prop.name == "broom":
        if mode == "held":  # upright beside the figure, bristles on the floor
            draw.line([at(6, 4), at(6, 20)], fill=prop.colour, width=width)
            draw.polygon([at(4, 0), at(8, 0), at(7, 4), at(5, 4)], fill=prop.detail)
        else:  # carried slanting at the side
            draw.line([at(hu - 3, hv - 4), at(hu + 2, hv + 9)], fill=prop.colour, width=width)
            draw.polygon(
                [at(hu - 5, hv - 8), at(hu - 1, hv - 9), at(hu - 2, hv - 4), at(hu - 4, hv - 4)], fill=prop.detail
            )
    elif prop.name == "umbrella":
        if mode == "held":  # open above the head
            draw.line([at(hu, hv), at(hu, hv + 14)], fill=prop.colour, width=width)
            draw.polygon(
                [at(hu - 7, hv + 13), at(hu + 7, hv + 13), at(hu + 4, hv + 17), at(hu - 4, hv + 17)], fill=prop.detail
            )
        else:  # closed, tip down
            draw.line([at(hu, hv + 2), at(hu + 1, hv - 6)], fill=prop.detail, width=2 * width)
    else:  # bucket: hangs from the hand, or raised in front
        top = hv + (3 if mode == "held" else -1)
        draw.polygon([at(hu - 2, top), at(hu + 2, top), at(hu + 1.5, top - 3), at(hu - 1.5, top - 3)], fill=prop.detail)
        draw.line([at(hu - 2, top), at(hu, top + 2), at(hu + 2, top)], fill=prop.colour, width=width)


def render_clip(turn: Turn, world: World, rng: np.random.Generator, size: ClipSize = CLIP) -> np.ndarray:
    """The clip of one turn: ``(frames, height, width, 3)`` uint8, deterministic for the rng's seed.

    The scene comes from the world's layout (the same at every turn); the rng only chooses a start
    and a facing when the turn leaves them open. The camera pans with the figure (``FOLLOW``), so
    each frame is a window on the wider scenery. Frames tile directly: ``np.concatenate(clip, axis=1)``.
    """
    assert turn.character == world.character.name, f"turn is for {turn.character}, world for {world.character.name}"
    place, time = PLACES_BY_NAME[turn.place], TIMES_BY_NAME[turn.time]
    if turn.start_x is None or turn.facing is None:
        turn = place_turn(turn, facing=turn.facing, size=size)
    assert turn.start_x is not None and turn.facing is not None
    scenery = render_scenery(place, time, world.layout_seed, size)
    if ACTIONS_BY_NAME[turn.action].railing:  # a seated figure does not travel, so the railing stays in frame
        light = time.indoor if place.indoor else time.light
        _draw_railing(ImageDraw.Draw(scenery), PAN_MARGIN + turn.start_x, place.floor_y, light)
    clip = np.empty((size.frames, size.height, size.width, 3), np.uint8)  # (F, H, W, C)
    for index, pose in enumerate(poses(turn, size)):
        left = PAN_MARGIN + round(turn.facing * camera_dx(pose))
        frame = scenery.crop((left, 0, left + size.width, size.height))
        x = turn.start_x + turn.facing * screen_dx(pose)
        draw_figure(ImageDraw.Draw(frame), world.character, pose, x, place.floor_y, turn.facing)
        clip[index] = np.asarray(frame)
    return clip


def figure_mask(frames: np.ndarray, character: Character) -> np.ndarray:
    """Where the character's body colour is, per pixel: ``(..., H, W)`` bool."""
    return np.all(frames == np.array(character.body, np.uint8), axis=-1)


def character_mask(frames: np.ndarray, character: Character, grow: int = 2) -> np.ndarray:
    """Where any of the character's own colours is, grown by ``grow`` pixels: ``(..., H, W)`` bool.

    Training weights these pixels: the figure is a sixth of the frame and the scenery the rest, so an
    unweighted loss learns the scenery first and blurs the figure into it. Scenery pixels that happen
    to share a skin or prop colour only add a little weight where it is not needed.
    """
    colours = (character.body, character.skin, character.hair, character.legs, character.accent)
    colours += (character.prop.colour, character.prop.detail)
    mask = np.zeros(frames.shape[:-1], bool)
    for colour in colours:
        mask |= np.all(frames == np.array(colour, np.uint8), axis=-1)
    for _ in range(grow):  # one pixel to each side per round
        grown = mask.copy()
        grown[..., 1:, :] |= mask[..., :-1, :]
        grown[..., :-1, :] |= mask[..., 1:, :]
        grown[..., :, 1:] |= mask[..., :, :-1]
        grown[..., :, :-1] |= mask[..., :, 1:]
        mask = grown
    return mask
