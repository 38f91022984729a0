"""The toy-world data set on disk: written so that a half-written folder can never pass for a whole one.

Layout of a folder::

    episode_00000.npz   frames uint8 [turns, 17, 64, 96, 3], compressed; one file per episode
    ...
    episodes.jsonl      one line per episode: id, file, character, turns (instruction, fields, deltas, motion)
    manifest.json       written LAST: format, version, clip size, counts, every file's size and sha256

Every file is written to a ``.tmp`` name and renamed, so a file is either whole or absent, and
the manifest exists only once everything it lists does: a folder without one is half-written.
``load_toyworld`` verifies every checksum before handing out episodes, whose frames load lazily.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from game.instruction import InstructionError, parse
from game.state import StateDeltas
from training.toyworld import (
    CHARACTERS_BY_NAME,
    CLIP,
    ClipSize,
    Turn,
    World,
    plan_episode,
    render_clip,
)

logger = logging.getLogger(__name__)

FORMAT = "animegamer-toyworld"
VERSION = 1
MANIFEST = "manifest.json"
EPISODES = "episodes.jsonl"
MAX_TURNS = 5  # an episode has 1..5 turns: the release's history window
HELD_OUT_EVERY = 10  # every 10th episode is held out for evaluation


class DatasetError(ValueError):
    """A data folder that cannot be used; the message names the folder or file and what to do."""


@dataclass(frozen=True)
class FileRecord:
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a whole folder holds; written last, so its presence means the folder is complete."""

    version: int
    frames: int
    height: int
    width: int
    fps: int
    seed: int
    episodes: int
    clips: int
    files: dict[str, FileRecord] = field(default_factory=dict)
    format: str = FORMAT

    @property
    def bytes(self) -> int:
        return sum(record.bytes for record in self.files.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Clip:
    """One turn as recorded: its instruction, the fields it came from, and its state changes."""

    instruction: str
    action: str
    adverb: str
    place: str
    time: str
    phrase: str  # how the instruction words the action
    start_x: float  # where the figure's feet start, so the clip can be drawn again from the record
    facing: int
    deltas: StateDeltas

    @property
    def motion(self) -> int:
        return self.deltas.motion


@dataclass(frozen=True)
class Episode:
    """1..5 turns of one character; ``frames()`` reads its file only when asked."""

    id: str
    character: str
    layout_seed: int
    path: Path
    clips: tuple[Clip, ...]
    size: ClipSize = CLIP

    @property
    def world(self) -> World:
        return World(character=CHARACTERS_BY_NAME[self.character], layout_seed=self.layout_seed)

    def turn(self, index: int) -> Turn:
        """The turn that drew clip ``index``: render_clip(episode.turn(i), episode.world, rng) redraws it."""
        clip = self.clips[index]
        return Turn(
            self.character,
            clip.action,
            clip.adverb,
            clip.place,
            clip.time,
            phrase=clip.phrase,
            start_x=clip.start_x,
            facing=clip.facing,
        )

    def frames(self) -> np.ndarray:
        """``(turns, frames, height, width, 3)`` uint8, read from the episode's file now."""
        expected = (len(self.clips), self.size.frames, self.size.height, self.size.width, 3)
        try:
            with np.load(self.path) as archive:
                frames = archive["frames"]
        except (OSError, KeyError, ValueError) as exc:
            raise DatasetError(f"{self.path} cannot be read ({exc}); write the data set again.") from exc
        if frames.shape != expected or frames.dtype != np.uint8:
            raise DatasetError(f"{self.path} holds {frames.dtype} {frames.shape}, expected uint8 {expected}.")
        return frames


@dataclass(frozen=True)
class ToyWorld:
    root: Path
    manifest: Manifest
    episodes: tuple[Episode, ...]

    def __len__(self) -> int:
        return len(self.episodes)

    def clips(self) -> Iterator[tuple[Episode, int]]:
        """Every clip as (episode, turn index), in order."""
        for episode in self.episodes:
            for index in range(len(episode.clips)):
                yield episode, index


def split(world: ToyWorld, every: int = HELD_OUT_EVERY) -> tuple[tuple[Episode, ...], tuple[Episode, ...]]:
    """(training, held out): every ``every``-th episode (index every-1, 2*every-1, ...) is held out.

    A fixed rule on the episode index, not a random draw, so the held-out set is the same for any
    reader and grows with the folder without reshuffling the episodes already in it.
    """
    if every < 2:
        raise ValueError(f"hold out every N-th episode with N >= 2, got {every}")
    training = tuple(e for i, e in enumerate(world.episodes) if i % every != every - 1)
    held_out = tuple(e for i, e in enumerate(world.episodes) if i % every == every - 1)
    return training, held_out


def write_atomic(path: Path, data: bytes) -> FileRecord:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return FileRecord(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def _clip_record(turn: Turn) -> dict[str, object]:
    deltas = turn.deltas
    return {
        "instruction": str(turn.instruction),
        "action": turn.action,
        "adverb": turn.adverb,
        "place": turn.place,
        "time": turn.time,
        "phrase": turn.phrase,
        "start_x": turn.start_x,
        "facing": turn.facing,
        "deltas": deltas.model_dump(),
        "motion": deltas.motion,
    }


def write_toyworld(
    out: Path, clips: int, seed: int = 0, progress: Callable[[int], None] | None = None, size: ClipSize = CLIP
) -> Manifest:
    """Render episodes of 1..5 turns until ``clips`` clips exist, and write them to a new folder ``out``.

    ``progress`` is called with the number of clips each episode adds. Deterministic for ``seed``:
    episode ``i`` is planned from ``(seed, i)`` and its clip ``j`` drawn from ``(seed, i, j)``.
    """
    if clips < 1:
        raise DatasetError(f"Asked for {clips} clips; write at least 1.")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(f"{out} exists and is not an empty folder; choose a new folder or delete it first.")
    out.mkdir(parents=True, exist_ok=True)

    files: dict[str, FileRecord] = {}
    lines: list[str] = []
    written = 0
    while written < clips:
        index = len(lines)
        rng = np.random.default_rng([seed, index])
        turns = min(int(rng.integers(1, MAX_TURNS + 1)), clips - written)
        world, plan = plan_episode(rng, turns)
        frames = np.stack(
            [render_clip(turn, world, np.random.default_rng([seed, index, j]), size) for j, turn in enumerate(plan)]
        )  # (turns, F, H, W, 3)
        name = f"episode_{index:05d}.npz"
        buffer = io.BytesIO()
        np.savez_compressed(buffer, frames=frames)
        files[name] = write_atomic(out / name, buffer.getvalue())
        episode = {
            "id": name.removesuffix(".npz"),
            "file": name,
            "character": world.character.name,
            "layout_seed": world.layout_seed,
            "turns": [_clip_record(turn) for turn in plan],
        }
        lines.append(json.dumps(episode, sort_keys=True))
        written += turns
        if progress is not None:
            progress(turns)

    files[EPISODES] = write_atomic(out / EPISODES, ("\n".join(lines) + "\n").encode())
    manifest = Manifest(
        version=VERSION,
        frames=size.frames,
        height=size.height,
        width=size.width,
        fps=size.fps,
        seed=seed,
        episodes=len(lines),
        clips=written,
        files=files,
    )
    write_atomic(out / MANIFEST, manifest.to_json().encode())
    logger.info("wrote %d episodes, %d clips to %s", manifest.episodes, manifest.clips, out)
    return manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_manifest(root: Path) -> Manifest:
    path = root / MANIFEST
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path} cannot be read ({exc}); write the data set again.") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise DatasetError(f"{path} is not a toy-world manifest (format {FORMAT!r} expected).")
    if raw.get("version") != VERSION:
        raise DatasetError(
            f"{path} is version {raw.get('version')!r}; this code reads version {VERSION}. "
            "Write the data set again with `animegamer data toyworld`."
        )
    try:
        files = {name: FileRecord(**record) for name, record in raw.pop("files").items()}
        return Manifest(**raw, files=files)
    except (KeyError, TypeError, AttributeError) as exc:
        raise DatasetError(f"{path} is missing or has unexpected fields ({exc}); write the data set again.") from exc


def _parse_episode(root: Path, number: int, line: str, size: ClipSize) -> Episode:
    where = f"{root / EPISODES} line {number}"
    try:
        raw = json.loads(line)
        clips = []
        for turn in raw["turns"]:
            parse(turn["instruction"])
            clips.append(
                Clip(
                    instruction=turn["instruction"],
                    action=turn["action"],
                    adverb=turn["adverb"],
                    place=turn["place"],
                    time=turn["time"],
                    phrase=turn["phrase"],
                    start_x=float(turn["start_x"]),
                    facing=int(turn["facing"]),
                    deltas=StateDeltas(**turn["deltas"]),
                )
            )
        episode = Episode(
            id=raw["id"],
            character=raw["character"],
            layout_seed=int(raw["layout_seed"]),
            path=root / raw["file"],
            clips=tuple(clips),
            size=size,
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, ValidationError, InstructionError) as exc:
        raise DatasetError(f"{where} is not a valid episode ({exc!r}).") from exc
    for index, clip in enumerate(episode.clips):  # the fields name this world's vocabulary, and agree
        try:
            turn = episode.turn(index)
            agrees = str(turn.instruction) == clip.instruction and turn.deltas == clip.deltas
        except (KeyError, InstructionError) as exc:
            raise DatasetError(f"{where}: turn {index + 1} names something this toy world lacks ({exc!r}).") from exc
        if not agrees:
            raise DatasetError(f"{where}: turn {index + 1} disagrees with the toy world's rules ({clip.instruction})")
    return episode


def load_toyworld(root: Path) -> ToyWorld:
    """Open a written folder after checking it is whole: manifest, version, every file and checksum."""
    root = Path(root)
    again = f"write it with `animegamer data toyworld --out {root} --clips N`"
    if not root.exists():
        raise DatasetError(f"{root} does not exist; {again}.")
    if not root.is_dir():
        raise DatasetError(f"{root} is not a folder; {again}.")
    present = sorted(path.name for path in root.iterdir())
    if not present:
        raise DatasetError(f"{root} is empty: no toy-world data set there; {again}.")
    if MANIFEST not in present:
        raise DatasetError(
            f"{root} has no {MANIFEST}: it is half-written ({len(present)} file{'s' if len(present) != 1 else ''} "
            "there; the manifest is written last). "
            f"Delete the folder and {again}."
        )
    manifest = _read_manifest(root)
    for name, record in sorted(manifest.files.items()):
        path = root / name
        if not path.is_file():
            raise DatasetError(f"{path} is listed in {MANIFEST} but missing; write the data set again.")
        if path.stat().st_size != record.bytes or _sha256(path) != record.sha256:
            raise DatasetError(f"{path} does not match its checksum in {MANIFEST}; write the data set again.")
    if EPISODES not in manifest.files:
        raise DatasetError(f"{root / MANIFEST} lists no {EPISODES}; write the data set again.")

    lines = (root / EPISODES).read_text().splitlines()
    size = ClipSize(manifest.frames, manifest.height, manifest.width, manifest.fps)
    episodes = tuple(_parse_episode(root, number, line, size) for number, line in enumerate(lines, 1) if line.strip())
    clips = sum(len(episode.clips) for episode in episodes)
    if len(episodes) != manifest.episodes or clips != manifest.clips:
        raise DatasetError(
            f"{root / EPISODES} holds {len(episodes)} episodes and {clips} clips; {MANIFEST} says "
            f"{manifest.episodes} and {manifest.clips}. Write the data set again."
        )
    for episode in episodes:
        if episode.path.name not in manifest.files:
            raise DatasetError(f"{episode.path} is not listed in {MANIFEST}; write the data set again.")
    return ToyWorld(root=root, manifest=manifest, episodes=episodes)
