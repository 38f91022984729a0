"""The toy-world folder: it round-trips, it is deterministic, and a broken folder is refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from game.instruction import parse
from training.dataset import (
    EPISODES,
    MANIFEST,
    VERSION,
    DatasetError,
    Episode,
    ToyWorld,
    load_toyworld,
    split,
    write_toyworld,
)
from training.toyworld import TIMES_BY_NAME, render_clip

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toyworld") / "tw"
    write_toyworld(folder, clips=20, seed=0)
    return folder


@pytest.fixture
def copy(written: Path, tmp_path: Path) -> Path:
    """A copy of the written folder that a test may break."""
    return Path(shutil.copytree(written, tmp_path / "tw"))


def test_the_data_set_round_trips(written):
    world = load_toyworld(written)
    assert world.manifest.clips == 20 == sum(len(e.clips) for e in world.episodes)
    for episode in world.episodes:
        frames = episode.frames()  # (turns, F, H, W, 3)
        for index, clip in enumerate(episode.clips):
            turn = episode.turn(index)
            assert str(turn.instruction) == clip.instruction
            assert turn.deltas == clip.deltas and clip.motion == clip.deltas.motion
            redrawn = render_clip(turn, episode.world, np.random.default_rng(0))
            assert np.array_equal(redrawn, frames[index])


def test_episodes_have_one_to_five_turns_of_one_character(written):
    world = load_toyworld(written)
    for episode in world.episodes:
        assert 1 <= len(episode.clips) <= 5
        assert {parse(clip.instruction).character for clip in episode.clips} == {episode.character}
        orders = [TIMES_BY_NAME[clip.time].order for clip in episode.clips]
        assert orders == sorted(orders), "time of day only moves forward"
    raw = [json.loads(line) for line in (written / EPISODES).read_text().splitlines()]
    assert [len(e["turns"]) for e in raw] == [len(e.clips) for e in world.episodes]


def test_the_same_seed_writes_the_same_files(written, tmp_path):
    again = write_toyworld(tmp_path / "again", clips=20, seed=0)
    assert again.files == load_toyworld(written).manifest.files
    other = write_toyworld(tmp_path / "other", clips=20, seed=1)
    assert other.files != again.files


def test_every_tenth_episode_is_held_out(written):
    world = load_toyworld(written)
    many = ToyWorld(world.root, world.manifest, tuple(world.episodes[i % len(world)] for i in range(25)))
    training, held_out = split(many)
    assert held_out == (many.episodes[9], many.episodes[19])
    assert len(training) == 23 and all(isinstance(e, Episode) for e in training)


def test_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_toyworld(tmp_path / "nowhere")


def test_an_empty_folder_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="is empty"):
        load_toyworld(tmp_path)


def test_a_folder_without_its_manifest_is_half_written(copy):
    (copy / MANIFEST).unlink()
    with pytest.raises(DatasetError, match=f"no {MANIFEST}: it is half-written"):
        load_toyworld(copy)


def test_a_listed_file_that_is_missing_is_named(copy):
    (copy / "episode_00002.npz").unlink()
    with pytest.raises(DatasetError, match=r"episode_00002\.npz is listed in manifest\.json but missing"):
        load_toyworld(copy)


def test_a_file_whose_checksum_differs_is_named(copy):
    path = copy / "episode_00001.npz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"episode_00001\.npz does not match its checksum"):
        load_toyworld(copy)


def test_a_manifest_of_another_version_is_refused(copy):
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["version"] = VERSION + 1
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=f"version {VERSION + 1}; this code reads version {VERSION}"):
        load_toyworld(copy)


def test_writing_into_a_folder_with_files_is_refused(copy):
    with pytest.raises(DatasetError, match="not an empty folder"):
        write_toyworld(copy, clips=3)


def test_the_cli_writes_a_folder(tmp_path):
    out = tmp_path / "tw"
    result = subprocess.run(
        [sys.executable, "-m", "animegamer", "data", "toyworld", "--out", str(out), "--clips", "6"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "6 clips" in result.stdout
    assert sum(len(e.clips) for e in load_toyworld(out).episodes) == 6
