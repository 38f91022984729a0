"""The nudity detector a worker runs over every clip before it leaves: NudeNet's ONNX model on onnxruntime.

NudeNet (MIT) ships its detector, ``320n.onnx`` (12 MB, a YOLOv8n over 18 body-part labels), inside its wheel, so
nothing is downloaded at run time. Its own ``NudeDetector.detect`` reads one image at a time and walks the model's
2,100 candidate boxes in Python to draw boxes; a clip needs neither the boxes nor NMS, only how sure the model is
of each label anywhere in any frame, which is one ``max`` over the model's output. The frames are prepared as
NudeNet prepares them (padded at the right and bottom to a square, resized to 320 with OpenCV's bilinear filter,
scaled to 0..1), in RGB order. NudeNet 3.4's own ``detect`` hands a 3-channel image to the model in BGR (its
RGBA conversion swaps the channels and ``blobFromImage`` swaps them back); the model, a YOLOv8 export, was trained on
RGB. On a photo of a woman (scikit-image's ``astronaut``) RGB scores FACE_FEMALE 0.81 and FACE_MALE 0.17, BGR 0.72
and 0.49; fed BGR, these scores equal ``detect``'s to 1e-3 (tests/worker/test_safety.py).

Fail closed: a worker whose detector cannot load, or raises on a clip, returns ``game.safety.unchecked`` with the
reason instead of scores, and the bot posts that clip nowhere.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from game.safety import SafetyReport, unchecked

log = logging.getLogger(__name__)

INPUT_SIZE = 320  # the model's square input
BATCH = 8  # frames per onnxruntime call: a 17-frame clip in three calls
# NudeNet's label order: the model's output channels 4..21 (after the box's centre x, y, width and height).
LABELS = (
    "FEMALE_GENITALIA_COVERED",
    "FACE_FEMALE",
    "BUTTOCKS_EXPOSED",
    "FEMALE_BREAST_EXPOSED",
    "FEMALE_GENITALIA_EXPOSED",
    "MALE_BREAST_EXPOSED",
    "ANUS_EXPOSED",
    "FEET_EXPOSED",
    "BELLY_COVERED",
    "FEET_COVERED",
    "ARMPITS_COVERED",
    "ARMPITS_EXPOSED",
    "FACE_MALE",
    "BELLY_EXPOSED",
    "MALE_GENITALIA_EXPOSED",
    "ANUS_COVERED",
    "FEMALE_BREAST_COVERED",
    "BUTTOCKS_COVERED",
)


class DetectorUnavailable(RuntimeError):
    """The detector cannot be loaded on this machine; the message names what is missing."""


class ClipChecker(Protocol):
    """Whatever scores a clip's frames: ``(T, H, W, 3)`` uint8 RGB in, a report out. Never raises."""

    name: str  # what /readyz and the reports say checked the clips

    def __call__(self, frames: np.ndarray) -> SafetyReport: ...


@dataclass
class NudeNetChecker:
    """NudeNet's detector over a clip's frames."""

    session: Any  # onnxruntime.InferenceSession
    name: str  # "nudenet 3.4.2 (320n)": which detector scored a clip, kept with its scores

    @classmethod
    def load(cls, threads: int = 0) -> NudeNetChecker:
        """The detector from NudeNet's wheel; ``threads`` for onnxruntime's operators (0: its own choice)."""
        try:
            import nudenet
            import onnxruntime
        except ImportError as exc:
            raise DetectorUnavailable(
                f"the nudity detector is not installed ({exc.name} is missing): pip install '.[worker]'"
            ) from exc
        model = Path(nudenet.__file__).with_name("320n.onnx")
        if not model.is_file():
            raise DetectorUnavailable(f"NudeNet's model {model} is missing: reinstall nudenet")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types for a damaged file
            raise DetectorUnavailable(f"NudeNet's model {model} does not load ({exc})") from exc
        shipped = getattr(importlib.import_module("nudenet.nudenet"), "__labels", None)  # its detect()'s own list
        if shipped is None or tuple(shipped) != LABELS:
            # Scores read in another order than the model writes them would miss nudity: refuse, never guess.
            raise DetectorUnavailable(
                f"nudenet {importlib.metadata.version('nudenet')} lists its labels as {shipped}, not in the order "
                f"this worker reads its model's outputs (worker/safety.py LABELS): install nudenet 3.4"
            )
        outputs = session.get_outputs()[0].shape
        if len(outputs) != 3 or outputs[1] != 4 + len(LABELS):
            raise DetectorUnavailable(f"{model} has outputs {outputs}, expected (batch, {4 + len(LABELS)}, boxes)")
        return cls(session, f"nudenet {importlib.metadata.version('nudenet')} ({model.stem})")

    def scores(self, frames: np.ndarray) -> np.ndarray:
        """Each frame's highest score per label: ``(T, H, W, 3)`` uint8 RGB -> ``(T, 18)`` float32."""
        assert frames.ndim == 4 and frames.shape[-1] == 3 and frames.dtype == np.uint8, frames.shape
        name = self.session.get_inputs()[0].name
        found = []
        for start in range(0, len(frames), BATCH):
            batch = np.stack([prepare(frame) for frame in frames[start : start + BATCH]])  # (B, 3, 320, 320)
            out = self.session.run(None, {name: batch})[0]  # (B, 22, boxes): cx, cy, w, h, then 18 label scores
            found.append(out[:, 4:, :].max(axis=2))  # (B, 18)
        return np.concatenate(found)

    def __call__(self, frames: np.ndarray) -> SafetyReport:
        started = time.perf_counter()
        try:
            per_frame = self.scores(frames)  # (T, 18)
        except Exception as exc:
            log.error("the nudity detector failed on a clip of shape %s: %r; the clip is withheld", frames.shape, exc)
            return unchecked(f"the detector failed: {type(exc).__name__}")
        highest = per_frame.max(axis=0)  # (18,)
        return SafetyReport(
            detector=self.name,
            scores={label: round(float(score), 4) for label, score in zip(LABELS, highest, strict=True)},
            frames=len(frames),
            seconds=round(time.perf_counter() - started, 4),
        )


def prepare(frame: np.ndarray) -> np.ndarray:
    """One RGB frame as NudeNet feeds its model: padded right and bottom to a square, 320 x 320, 0..1, CHW."""
    import cv2  # NudeNet's own dependency: the same resize as its preprocessing

    height, width, _ = frame.shape
    side = max(height, width)
    square = np.zeros((side, side, 3), np.uint8)
    square[:height, :width] = frame
    resized = cv2.resize(square, (INPUT_SIZE, INPUT_SIZE), interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(resized.transpose(2, 0, 1), dtype=np.float32) / 255.0


@dataclass
class Missing:
    """A worker with no detector: every clip's report says why, and the bot withholds the clip."""

    why: str

    @property
    def name(self) -> str:
        return f"none: {self.why}"

    def __call__(self, frames: np.ndarray) -> SafetyReport:
        return unchecked(self.why)


def load_checker(threads: int = 0) -> ClipChecker:
    """This worker's detector, or a stand-in that fails every clip closed, with the reason logged once."""
    try:
        return NudeNetChecker.load(threads)
    except DetectorUnavailable as exc:
        log.error("no nudity detector on this worker (%s): every clip it makes will be withheld", exc)
        return Missing(str(exc))
