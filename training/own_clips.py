"""Your own clips as a training data set: `animegamer data check` and `animegamer data prepare`.

A fan brings a folder of videos and ``annotations.jsonl`` beside them, one JSON object a line, one line a clip::

    {"file": "clips/beach.mp4", "start": 1.5, "end": 4.0, "character": "Mika", "adverb": "quickly",
     "motion": "run", "background": "beach", "time": "day", "ML": 3, "SC": 0, "ET": 2, "ST": -2}

- ``file``: the video, relative to the folder; any container and codec FFmpeg (PyAV) reads;
- ``start``, ``end``: seconds into the video; the clip is the 17 frames at 8 fps from ``start`` (2 s), so the span
  must be at least that long and inside the video;
- ``character``, ``adverb`` (one of ``game.instruction.ADVERBS``, or ``""``), ``motion``, ``background``, ``time``
  (one of ``game.instruction.TIMES``, or ``""``): the instruction the clip answers, checked as a player's would be;
- ``ML``, ``SC``, ``ET``, ``ST``: the turn's changes to motion level, social, entertainment and stamina, -5..5,
  the four values the MLLM learns to predict (ANIMEGAMER.md);
- ``episode`` (optional): lines with the same value, in file order, are consecutive turns of one episode (1..5),
  the history the MLLM reads; a line without one is an episode of its own.

``check`` validates every line (fields, ranges, the instruction, that the video opens and holds the span) and
reports each bad line by its number; ``prepare`` does the same, stops if any line is bad, and otherwise cuts and
resamples every clip to the model's frames (cropped to the model's aspect, then resized) into a new folder that
is renamed into place only once whole: nothing half written is ever left where the phases look.

The folder written has the toy world's shape (``training.dataset``): ``episode_NNNNN.npz`` frames uint8
``[turns, 17, H, W, 3]``, ``episodes.jsonl`` and ``manifest.json`` written last with every file's checksum, its
``format`` saying that these are a user's clips, not drawn ones.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from game.instruction import ADVERBS, InstructionError, from_fields
from game.state import DELTA_MAX, DELTA_MIN, StateDeltas
from training.dataset import EPISODES, MANIFEST, MAX_TURNS, DatasetError, FileRecord, write_atomic
from worker.pipeline.config import full

FORMAT = "animegamer-clips"
VERSION = 1
ANNOTATIONS = "annotations.jsonl"
_PUBLISHED = full()
FRAMES, FPS = _PUBLISHED.num_frames, _PUBLISHED.fps  # the published clip: 17 frames at 8 fps
SIZE = (_PUBLISHED.height, _PUBLISHED.width)  # 480 x 720


class Annotation(BaseModel):
    """One line of annotations.jsonl; every field but ``episode`` is required, so a forgotten one is named."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(min_length=1)
    start: float = Field(ge=0)
    end: float = Field(gt=0)
    character: str
    adverb: str
    motion: str
    background: str
    time: str
    ML: int = Field(ge=DELTA_MIN, le=DELTA_MAX, strict=True)
    SC: int = Field(ge=DELTA_MIN, le=DELTA_MAX, strict=True)
    ET: int = Field(ge=DELTA_MIN, le=DELTA_MAX, strict=True)
    ST: int = Field(ge=DELTA_MIN, le=DELTA_MAX, strict=True)
    episode: str | None = None

    @property
    def deltas(self) -> StateDeltas:
        return StateDeltas(motion=self.ML, social=self.SC, entertainment=self.ET, stamina=self.ST)


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, as an editor shows it
    annotation: Annotation
    instruction: str


@dataclass
class Report:
    """What ``check`` found: the good lines, and one message for each bad one."""

    folder: Path
    lines: list[Line] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.lines) and not self.problems

    def __str__(self) -> str:
        if not self.problems and not self.lines:
            return f"{self.folder / ANNOTATIONS}: no clips."
        head = f"{self.folder / ANNOTATIONS}: {len(self.lines)} good, {len(self.problems)} bad."
        return "\n".join([head, *self.problems])


def _field_problem(error: dict) -> str:
    name = ".".join(str(part) for part in error["loc"]) or "the line"
    if error["type"] == "missing":
        return f"missing field '{name}'"
    if error["type"] == "extra_forbidden":
        return f"unknown field '{name}'"
    return f"field '{name}': {error['msg'].lower()}, got {error['input']!r}"


def _video_problem(path: Path, start: float, end: float, frames: int, fps: int) -> str | None:
    """Why this span of this video cannot give the clip, or None when it can."""
    if not path.is_file():
        return f"{path.name}: no such file"
    needed = (frames - 1) / fps
    if end - start < needed:
        return f"clip too short: {end - start:.2f} s from {start:g} to {end:g}, a clip needs {needed:g} s"
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return f"{path.name}: no video stream"
            stream = container.streams.video[0]
            if stream.duration is not None and stream.time_base is not None:
                length = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                length = container.duration / av.time_base
            else:
                return None  # no length in the header: prepare finds out by decoding
    except (av.FFmpegError, OSError) as exc:
        return f"{path.name}: unreadable video ({exc})"
    if start + needed > length + 0.5 / fps:
        return f"clip too short: the video is {length:.2f} s, the clip needs {start:g} to {start + needed:g} s"
    return None


def check(folder: Path, frames: int = FRAMES, fps: int = FPS) -> Report:
    """Every line of ``folder/annotations.jsonl`` validated; the videos opened, not decoded."""
    folder = Path(folder)
    report = Report(folder)
    path = folder / ANNOTATIONS
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        report.problems.append(f"{path}: cannot be read ({exc})")
        return report
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        problem = _line_problem(folder, number, raw, report, frames, fps)
        if problem is not None:
            report.problems.append(f"line {number}: {problem}")
    _check_episodes(report)
    return report


def _line_problem(folder: Path, number: int, raw: str, report: Report, frames: int, fps: int) -> str | None:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(data, dict):
        return "not a JSON object"
    try:
        annotation = Annotation.model_validate(data)
    except ValidationError as exc:
        return "; ".join(_field_problem(error) for error in exc.errors())
    if annotation.end <= annotation.start:
        return f"end {annotation.end:g} is not after start {annotation.start:g}"
    try:
        motion = f"{annotation.adverb} {annotation.motion}".strip()
        instruction = from_fields(annotation.character, motion, annotation.background, annotation.time)
    except InstructionError as exc:
        return str(exc)
    if annotation.adverb and instruction.adverb != annotation.adverb.lower():
        return f"field 'adverb': {annotation.adverb!r} is not one of {', '.join(sorted(ADVERBS))}, or empty"
    problem = _video_problem(folder / annotation.file, annotation.start, annotation.end, frames, fps)
    if problem is not None:
        return problem
    report.lines.append(Line(number, annotation, str(instruction)))
    return None


def _check_episodes(report: Report) -> None:
    """An episode's lines must follow one another and number at most MAX_TURNS (the release's history)."""
    for episode in _episodes(report.lines):
        name = episode[0].annotation.episode
        if name is None:
            continue
        if len(episode) > MAX_TURNS:
            report.problems.append(
                f"line {episode[MAX_TURNS].number}: episode {name!r} has {len(episode)} turns, at most {MAX_TURNS}"
            )
        characters = {line.annotation.character for line in episode}
        if len(characters) > 1:
            report.problems.append(f"line {episode[0].number}: episode {name!r} has several characters")
    seen: set[str] = set()
    for episode in _episodes(report.lines):
        name = episode[0].annotation.episode
        if name is not None and name in seen:
            report.problems.append(f"line {episode[0].number}: episode {name!r} continues after other lines")
        if name is not None:
            seen.add(name)


def _episodes(lines: list[Line]) -> list[list[Line]]:
    """Runs of consecutive lines with the same ``episode``; a line without one stands alone."""
    runs: list[list[Line]] = []
    for line in lines:
        name = line.annotation.episode
        if runs and name is not None and runs[-1][0].annotation.episode == name:
            runs[-1].append(line)
        else:
            runs.append([line])
    return runs


def read_clip(path: Path, start: float, frames: int, fps: int, height: int, width: int) -> np.ndarray:
    """``(frames, height, width, 3)`` uint8: the frame on screen at ``start + i / fps`` for each i, cropped to the
    model's aspect around the centre and resized."""
    times = [Fraction(start).limit_denominator(1000) + Fraction(i, fps) for i in range(frames)]
    picked: list[np.ndarray | None] = [None] * frames
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        last: av.VideoFrame | None = None
        index = 0
        for frame in container.decode(stream):
            shown = frame.time if frame.time is not None else 0.0
            while index < frames and shown > float(times[index]) + 1e-6:
                picked[index] = _fit(last or frame, height, width)  # the frame still on screen at that time
                index += 1
            last = frame
            if index == frames:
                break
        on_screen = 1 / float(stream.average_rate or fps)  # how long the video's last frame is shown
        while index < frames and last is not None and float(times[index]) < (last.time or 0.0) + on_screen - 1e-6:
            picked[index] = _fit(last, height, width)  # the last frame stays on screen for its own duration
            index += 1
    if index < frames:
        raise DatasetError(f"{path.name} ends before {float(times[index]):.2f} s; the clip needs {frames} frames")
    return np.stack(picked)


def _fit(frame: av.VideoFrame, height: int, width: int) -> np.ndarray:
    image = frame.to_image()
    scale = max(height / image.height, width / image.width)
    crop_w, crop_h = width / scale, height / scale
    left, top = (image.width - crop_w) / 2, (image.height - crop_h) / 2
    box = (left, top, left + crop_w, top + crop_h)
    return np.asarray(image.resize((width, height), Image.Resampling.BICUBIC, box=box), dtype=np.uint8)


@dataclass(frozen=True)
class Prepared:
    out: Path
    episodes: int
    clips: int
    bytes: int


def prepare(
    folder: Path,
    out: Path,
    size: tuple[int, int] = SIZE,
    frames: int = FRAMES,
    fps: int = FPS,
    progress: Callable[[int], None] | None = None,
) -> Prepared:
    """Check every line; if all are good, write the data set to ``out`` (new or empty), whole or not at all."""
    report = check(folder, frames, fps)
    if not report.ok:
        raise DatasetError(str(report))
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(f"{out} exists and is not empty; give a new folder")
    height, width = size
    work = out.with_name(f".{out.name}.partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        files, lines = _write_episodes(Path(folder), work, report.lines, (frames, height, width, fps), progress)
        files[EPISODES] = write_atomic(work / EPISODES, ("\n".join(lines) + "\n").encode())
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "frames": frames,
            "height": height,
            "width": width,
            "fps": fps,
            "episodes": len(lines),
            "clips": len(report.lines),
            "files": {name: asdict(record) for name, record in files.items()},
        }
        write_atomic(work / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        if out.exists():
            out.rmdir()
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Prepared(out, len(lines), len(report.lines), sum(record.bytes for record in files.values()))


def _write_episodes(
    folder: Path,
    work: Path,
    good: list[Line],
    shape: tuple[int, int, int, int],
    progress: Callable[[int], None] | None,
) -> tuple[dict[str, FileRecord], list[str]]:
    frames, height, width, fps = shape
    files: dict[str, FileRecord] = {}
    lines: list[str] = []
    for index, episode in enumerate(_episodes(good)):
        clips = []
        for line in episode:
            try:
                a = line.annotation
                clips.append(read_clip(folder / a.file, a.start, frames, fps, height, width))
            except (av.FFmpegError, OSError, DatasetError) as exc:
                raise DatasetError(f"line {line.number}: {exc}") from exc
            if progress is not None:
                progress(1)
        name = f"episode_{index:05d}.npz"
        buffer = io.BytesIO()
        np.savez_compressed(buffer, frames=np.stack(clips))  # (turns, frames, height, width, 3)
        files[name] = write_atomic(work / name, buffer.getvalue())
        record = {
            "id": name.removesuffix(".npz"),
            "file": name,
            "character": episode[0].annotation.character,
            "turns": [_turn_record(line) for line in episode],
        }
        lines.append(json.dumps(record, sort_keys=True))
    return files, lines


def _turn_record(line: Line) -> dict[str, object]:
    a = line.annotation
    return {
        "instruction": line.instruction,
        "deltas": a.deltas.model_dump(),
        "motion": a.ML,
        "source": {"file": a.file, "start": a.start, "line": line.number},
    }


def parse_size(text: str) -> tuple[int, int]:
    """``"480x720"`` -> (480, 720): height by width, as the model's config writes it; multiples of 16."""
    try:
        height, width = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"a size is HEIGHTxWIDTH, like 480x720, got {text!r}") from None
    if height < 16 or width < 16 or height % 16 or width % 16:
        raise ValueError(f"height and width must be multiples of 16, at least 16, got {text!r}")
    return height, width
