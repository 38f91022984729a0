"""Measures of a generated toy-world turn: its states, its motion, its pixels, and what a person would check.

The paper scores states with ACC-S / MAE-S and motion with ACC-F / MAE-F (the clip's optical flow,
binned into a motion level, against the instruction's level); the toy world knows every clip's
truth exactly, so the same names are used here for the same measures. The rest are checks a viewer
makes by eye: is it night when it should be, does the figure fly up and across, does it keep its
colours from turn to turn. Every function takes uint8 clips ``(T, H, W, 3)`` as decoded from the
pipeline's MP4, and nothing here knows about models, so ground truth can be scored the same way.

A figure is found by its body colour (unique in the toy world), allowing for what H.264's chroma
subsampling does to a small figure. A clip where it cannot be found fails a check; it never passes
one by having nothing to measure.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import cv2
import numpy as np

from game.state import StateDeltas
from media.mp4 import decode_mp4  # noqa: F401 - the benchmarks read clips through metrics

RGB = tuple[int, int, int]
T = TypeVar("T")
STATE_NAMES = ("motion", "social", "entertainment", "stamina")
DAY_TIMES, NIGHT_TIMES = frozenset({"morning", "day"}), frozenset({"night"})
# The actions with a direction, and what moves_right_way asks of each: the figure's body rises, falls or crosses
# the frame by at least RISE, DROP or ACROSS pixels (the camera pans with a figure that travels, which crosses the
# frame by 30% of its travel: toyworld.FOLLOW).
MOTION_CHECKS = {
    "fly on broomstick": ("rises", "crosses"),
    "walk": ("crosses",),
    "run": ("crosses",),
    "jump": ("jumps",),  # rises at mid-clip, back down at the end
    "sit down": ("drops",),
    "lie down": ("drops",),
}
# Qiqi's body (52, 28, 96) is 31 from the night sky near the horizon, so 28 and no more; measured on
# MP4 round trips of rendered clips, 28 still finds the figure in 99% of frames.
TOLERANCE = 28.0
MIN_PIXELS = 30  # a blob smaller than this is a speck, not a figure (bodies are 150+ pixels)
MAX_STEP = 12.0  # pixels a frame a figure's centre may move: rendered ground truth's most is 9.3 (a rapid dance)
RISE, ACROSS, DROP = 4.0, 4.0, 6.0  # pixels; rendered truth's least: 5.6 (slow jump), 6.3 (slow walk), 11 (sit)
_EPS = 1e-3  # pixels/frame: keeps log() finite for a still clip
# OpenCV's usual Farneback settings; a 15-pixel window spans a toy figure's body.
FARNEBACK = {"pyr_scale": 0.5, "levels": 3, "winsize": 15, "iterations": 3, "poly_n": 5, "poly_sigma": 1.2, "flags": 0}


def flow_magnitude(clip: np.ndarray) -> float:
    """Mean Farneback optical-flow magnitude (pixels/frame) over consecutive frames: the clip's motion scope."""
    grey = [cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY) for frame in clip]  # T x (H, W)
    magnitudes = [
        np.linalg.norm(cv2.calcOpticalFlowFarneback(a, b, None, **FARNEBACK), axis=-1).mean()
        for a, b in itertools.pairwise(grey)  # flow (H, W, 2) per pair
    ]
    return float(np.mean(magnitudes)) if magnitudes else 0.0


def _medians(groups: dict[int, list[float]]) -> dict[int, float]:
    return {level: float(np.median(values)) for level, values in sorted(groups.items())}


def _nearest(flow: float, medians: dict[int, float]) -> int:
    return min(medians, key=lambda level: abs(math.log(flow + _EPS) - math.log(medians[level] + _EPS)))


@dataclass(frozen=True)
class FlowScale:
    """Flow -> motion level, learnt from ground-truth clips: the median flow of each level.

    Actions move very differently (a run at level 2 outflows a head turn at level 5), so with the
    clips' actions given, each action gets its own medians; one scale for all scores rendered
    ground truth at about chance. Levels an action never showed in calibration are left out.
    """

    medians: dict[int, float]  # level -> median flow over all calibration clips
    by_action: dict[str, dict[int, float]] = field(default_factory=dict)  # action -> level -> median flow

    @classmethod
    def fit(cls, clips: Iterable[np.ndarray], levels: Sequence[int], actions: Sequence[str] | None = None) -> FlowScale:
        flows = [flow_magnitude(clip) for clip in clips]
        names = actions if actions is not None else [None] * len(flows)
        assert len(flows) == len(levels) == len(names), "one level (and action) per clip"
        overall: dict[int, list[float]] = {}
        per_action: dict[str, dict[int, list[float]]] = {}
        for flow, level, action in zip(flows, levels, names, strict=True):
            overall.setdefault(level, []).append(flow)
            if action is not None:
                per_action.setdefault(action, {}).setdefault(level, []).append(flow)
        return cls(_medians(overall), {action: _medians(groups) for action, groups in per_action.items()})

    def level(self, flow: float, action: str | None = None) -> int:
        """The level whose median flow is nearest (in log space: levels roughly multiply the flow)."""
        return _nearest(flow, self.by_action.get(action, self.medians) if action else self.medians)


def flow_scores(measured: Sequence[int], instructed: Sequence[int]) -> dict[str, float]:
    """ACC-F: how often the clip's measured level is the instruction's; MAE-F: how far off it is on average."""
    diff = np.abs(np.asarray(measured) - np.asarray(instructed))
    return {"ACC-F": float(np.mean(diff == 0)), "MAE-F": float(np.mean(diff))}


def quick_over_gentle(flows: Sequence[float], levels: Sequence[int]) -> float | None:
    """Mean flow of quick clips (level 4-5) over that of gentle ones (1-2): above 1 when quicker moves more.

    A still model scores 1, not a division by zero; None when either group is empty.
    """
    quick = [flow for flow, level in zip(flows, levels, strict=True) if level >= 4]
    gentle = [flow for flow, level in zip(flows, levels, strict=True) if level <= 2]
    return (float(np.mean(quick)) + _EPS) / (float(np.mean(gentle)) + _EPS) if quick and gentle else None


def state_scores(pred: Sequence[StateDeltas], truth: Sequence[StateDeltas]) -> dict[str, dict[str, float]]:
    """ACC-S (exact match rate) and MAE-S (mean absolute error) for each of the four state values."""
    assert len(pred) == len(truth) > 0, "one prediction per true turn"
    scores: dict[str, dict[str, float]] = {}
    for name in STATE_NAMES:
        diff = np.abs(np.array([getattr(p, name) for p in pred]) - np.array([getattr(t, name) for t in truth]))
        scores[name] = {"ACC-S": float(np.mean(diff == 0)), "MAE-S": float(np.mean(diff))}
    return scores


def pixel_error(clip: np.ndarray, truth: np.ndarray) -> float:
    """Mean absolute difference in 0..255 against the rendered clip: fidelity, position and all."""
    assert clip.shape == truth.shape, f"clip {clip.shape} vs truth {truth.shape}"
    return float(np.mean(np.abs(clip.astype(np.int16) - truth.astype(np.int16))))


def frame_psnr(clip: np.ndarray, reference: np.ndarray) -> list[float]:
    """Each frame's PSNR in dB against the same frame of ``reference`` (inf where they are identical): how far a
    compute cut moved a clip from the full-compute one of the same seed."""
    assert clip.shape == reference.shape, f"clip {clip.shape} vs reference {reference.shape}"
    mse = ((clip.astype(np.float64) - reference.astype(np.float64)) ** 2).mean(axis=(1, 2, 3))
    return [10.0 * math.log10(255.0**2 / m) if m else math.inf for m in mse]


def frame_ssim(clip: np.ndarray, reference: np.ndarray) -> list[float]:
    """Each frame's SSIM against ``reference``, on luma: Wang et al. (2004) with their constants, an 11x11 Gaussian
    window of sigma 1.5, K1 = 0.01 and K2 = 0.03 of the 255 range."""
    assert clip.shape == reference.shape, f"clip {clip.shape} vs reference {reference.shape}"
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    scores = []
    for a_rgb, b_rgb in zip(clip, reference, strict=True):
        a = cv2.cvtColor(a_rgb, cv2.COLOR_RGB2GRAY).astype(np.float64)
        b = cv2.cvtColor(b_rgb, cv2.COLOR_RGB2GRAY).astype(np.float64)
        blur = lambda x: cv2.GaussianBlur(x, (11, 11), 1.5)  # noqa: E731
        mu_a, mu_b = blur(a), blur(b)
        var_a, var_b, cov = blur(a * a) - mu_a**2, blur(b * b) - mu_b**2, blur(a * b) - mu_a * mu_b
        ssim = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
        scores.append(float(ssim.mean()))
    return scores


def brightness(clip: np.ndarray) -> float:
    """Mean luma (BT.601) of the clip, 0..255: the toy world lights its scenery by the time of day."""
    return float(np.mean(clip.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)))


@dataclass(frozen=True)
class DayNight:
    """Bright or dark enough for its time: a threshold halfway between night and day ground truth."""

    threshold: float

    @classmethod
    def fit(cls, clips: Iterable[np.ndarray], times: Sequence[str]) -> DayNight:
        """Evening sits between the two and is left out: a person could not call it either way."""
        values = [brightness(clip) for clip in clips]
        day = [value for value, time in zip(values, times, strict=True) if time in DAY_TIMES]
        night = [value for value, time in zip(values, times, strict=True) if time in NIGHT_TIMES]
        if not day or not night:
            raise ValueError(f"need day and night clips to fit on, got {len(day)} day and {len(night)} night")
        return cls(threshold=(float(np.mean(day)) + float(np.mean(night))) / 2)

    def time_of_day_right(self, clip: np.ndarray, time: str) -> bool | None:
        """Day or morning bright, night dark; None for evening, which this check does not judge."""
        if time in DAY_TIMES:
            return brightness(clip) > self.threshold
        if time in NIGHT_TIMES:
            return brightness(clip) < self.threshold
        return None


def figure_pixels(frame: np.ndarray, body: RGB, tolerance: float = TOLERANCE) -> np.ndarray | None:
    """``(H, W)`` bool: the largest blob within ``tolerance`` of the body colour, or None when none is big enough.

    The largest connected blob, not every matching pixel: scattered look-alike pixels (noise, a
    random model's speckle) never add up to a figure, nor drag its centre about.
    """
    distance = np.linalg.norm(frame.astype(np.float32) - np.array(body, np.float32), axis=-1)  # (H, W)
    count, labels, stats, _ = cv2.connectedComponentsWithStats((distance <= tolerance).astype(np.uint8), connectivity=8)
    if count < 2:
        return None
    largest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    return labels == largest if stats[largest, cv2.CC_STAT_AREA] >= MIN_PIXELS else None


def _centre(mask: np.ndarray) -> tuple[float, float]:
    rows, cols = np.nonzero(mask)
    return float(cols.mean()), float(rows.mean())


def _top(mask: np.ndarray) -> int:
    return int(np.nonzero(mask.any(axis=1))[0][0])  # the body's highest row (rows grow downwards)


def figure_track(clip: np.ndarray, body: RGB, tolerance: float = TOLERANCE) -> list[tuple[float, float] | None]:
    """The figure's centre ``(x, y)`` in pixels per frame, None where it is not found."""
    masks = [figure_pixels(frame, body, tolerance) for frame in clip]
    return [None if mask is None else _centre(mask) for mask in masks]


def is_figure(track: Sequence[tuple[float, float] | None]) -> bool:
    """Found in at least half the frames and never jumping more than MAX_STEP pixels a frame.

    A random model's colour patches match a body colour here and there, a different patch each
    frame; a figure is there most of the clip and moves continuously.
    """
    found = [(index, point) for index, point in enumerate(track) if point is not None]
    if not found or 2 * len(found) < len(track):
        return False
    return all(math.dist(p, q) <= MAX_STEP * (j - i) for (i, p), (j, q) in itertools.pairwise(found))


def _ends(values: Sequence[T | None]) -> tuple[T, T] | None:
    """The first value found in the clip's first quarter and the last in its last quarter, else None."""
    quarter = max(1, len(values) // 4)
    start = next((value for value in values[:quarter] if value is not None), None)
    end = next((value for value in reversed(values[-quarter:]) if value is not None), None)
    return (start, end) if start is not None and end is not None else None


def moves_right_way(action: str, clip: np.ndarray, body: RGB, tolerance: float = TOLERANCE) -> bool | None:
    """Whether the figure moves as ``action`` does (MOTION_CHECKS): flying rises and crosses, walking and running
    cross, a jump rises at mid-clip, sitting and lying down end lower. None for other actions, or when no figure is
    found (see is_figure) or not at the start or end: a caller scoring MOTION_CHECKS counts that as a failure.
    """
    if action not in MOTION_CHECKS:
        return None
    masks = [figure_pixels(frame, body, tolerance) for frame in clip]
    track = [None if mask is None else _centre(mask) for mask in masks]
    tops = [None if mask is None else _top(mask) for mask in masks]
    if not is_figure(track):
        return None
    ends, top_ends = _ends(track), _ends(tops)
    if ends is None or top_ends is None:
        return None
    (x0, _), (x1, _) = ends
    top0, top1 = top_ends
    middle = [top for top in tops[len(tops) // 4 : -(len(tops) // 4)] if top is not None]
    passed = {
        "rises": top0 - top1 >= RISE,
        "crosses": abs(x1 - x0) >= ACROSS,
        "drops": top1 - top0 >= DROP,
        "jumps": bool(middle) and top0 - min(middle) >= RISE and min(middle) - top1 <= -RISE,
    }
    return all(passed[check] for check in MOTION_CHECKS[action])


def figure_colour(clip: np.ndarray, body: RGB, tolerance: float = TOLERANCE) -> np.ndarray | None:
    """Mean RGB ``(3,)`` of the figure's body over the frames it is found in; None unless is_figure."""
    masks = [figure_pixels(frame, body, tolerance) for frame in clip]
    if not is_figure([None if mask is None else _centre(mask) for mask in masks]):
        return None
    return np.concatenate([frame[mask] for frame, mask in zip(clip, masks, strict=True) if mask is not None]).mean(
        axis=0, dtype=np.float64
    )


def colour_drift(colours: Sequence[np.ndarray | None]) -> list[float | None]:
    """RGB distance of turn k's figure colour (k >= 2) from turn 1's; None where either was not found."""
    first = colours[0] if colours else None
    return [
        float(np.linalg.norm(colour - first)) if colour is not None and first is not None else None
        for colour in colours[1:]
    ]


def position_jump(before: np.ndarray, after: np.ndarray, body: RGB, tolerance: float = TOLERANCE) -> float | None:
    """Pixels between the figure's centre in ``before``'s last frame and ``after``'s first: how far it jumps
    between two turns in the same place, where the toy world's figure starts where it stopped. None unless the
    figure is in both frames."""
    end, start = figure_pixels(before[-1], body, tolerance), figure_pixels(after[0], body, tolerance)
    return None if end is None or start is None else math.dist(_centre(end), _centre(start))
