"""`animegamer data check` and `prepare`: a fan's folder of videos and annotations.jsonl, as they would bring it.

The fixture video shows its own frame number: frame k is a flat grey of level 20 + 2k, 24 fps, 4 s, 120x160, so a
prepared frame's level says which source frame was picked.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from animegamer.cli import main
from media.mp4 import encode_mp4
from training.dataset import DatasetError
from training.own_clips import ANNOTATIONS, check, prepare

SOURCE_FPS = 24
SIZE = (64, 96)


def good(**changes: object) -> dict[str, object]:
    line: dict[str, object] = {
        "file": "clips/counter.mp4",
        "start": 1.0,
        "end": 3.5,
        "character": "Mika",
        "adverb": "quickly",
        "motion": "run",
        "background": "beach",
        "time": "day",
        "ML": 3,
        "SC": 0,
        "ET": 2,
        "ST": -2,
    }
    line.update(changes)
    return line


def write_lines(folder: Path, lines: list[object]) -> None:
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    (folder / ANNOTATIONS).write_text(text + "\n")


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("own") / "clips"
    folder.mkdir()
    levels = 20 + 2 * np.arange(4 * SOURCE_FPS)
    frames = np.broadcast_to(levels[:, None, None, None], (len(levels), 120, 160, 3)).astype(np.uint8)
    (folder / "counter.mp4").write_bytes(encode_mp4(frames, SOURCE_FPS))
    (folder / "broken.mp4").write_bytes(b"this is not a video" * 100)
    return folder


@pytest.fixture
def folder(tmp_path: Path, videos: Path) -> Path:
    (tmp_path / "clips").symlink_to(videos)
    return tmp_path


def test_a_good_folder_passes_the_check_with_each_line_as_an_instruction(folder: Path) -> None:
    write_lines(folder, [good(), good(adverb="", time="", motion="wave", background="town square")])
    report = check(folder)
    assert report.ok, str(report)
    assert [line.instruction for line in report.lines] == [
        "Character: Mika; Motion: quickly run; Background: day beach.",
        "Character: Mika; Motion: wave; Background: town square.",
    ]


BAD_LINES = [
    ('{"file": "clips/counter.mp4", ', "not JSON"),
    (good(motion=None) | {"motion": None}, "field 'motion'"),
    ({k: v for k, v in good().items() if k != "background"}, "missing field 'background'"),
    (good(ML=7), "field 'ML'"),
    (good(ST=2.5), "field 'ST'"),
    (good(colour="red"), "unknown field 'colour'"),
    (good(adverb="sleepily"), "adverb"),
    (good(time="teatime"), "Time must be one of"),
    (good(start=2.0, end=3.0), "clip too short: 1.00 s"),
    (good(start=3.0, end=6.0), "clip too short: the video is 4.00 s"),
    (good(start=3.0, end=2.0), "end 2 is not after start 3"),
    (good(file="clips/missing.mp4"), "missing.mp4: no such file"),
    (good(file="clips/broken.mp4"), "broken.mp4: unreadable video"),
]


@pytest.mark.parametrize(("bad", "named"), BAD_LINES, ids=[named for _, named in BAD_LINES])
def test_a_bad_line_is_named_with_its_number_and_what_is_wrong(folder: Path, bad: object, named: str) -> None:
    write_lines(folder, [good(), bad, good()])
    report = check(folder)
    assert not report.ok and len(report.lines) == 2
    assert len(report.problems) == 1 and report.problems[0].startswith("line 2: "), report.problems
    assert named in report.problems[0], report.problems


def test_every_bad_line_is_reported_not_only_the_first(folder: Path) -> None:
    write_lines(folder, [good(ML=9), good(), "[]", good(file="clips/missing.mp4")])
    assert [problem.split(":")[0] for problem in check(folder).problems] == ["line 1", "line 3", "line 4"]


def test_an_episode_of_more_than_five_turns_is_refused(folder: Path) -> None:
    write_lines(folder, [good(episode="beach day")] * 6)
    assert check(folder).problems == ["line 6: episode 'beach day' has 6 turns, at most 5"]


def test_each_prepared_frame_is_the_one_on_screen_every_eighth_of_a_second(folder: Path, tmp_path: Path) -> None:
    write_lines(folder, [good(start=1.0, end=3.5)])
    prepare(folder, tmp_path / "data", size=SIZE)
    with np.load(tmp_path / "data" / "episode_00000.npz") as archive:
        frames = archive["frames"]
    assert frames.shape == (1, 17, *SIZE, 3) and frames.dtype == np.uint8
    source = SOURCE_FPS * 1.0 + SOURCE_FPS / 8 * np.arange(17)  # 24, 27, ..., 72
    levels = frames[0].reshape(17, -1).mean(axis=1)
    assert np.abs(levels - (20 + 2 * source)).max() < 1.5, levels  # neighbours are 2 levels apart


def test_prepare_writes_episodes_with_their_instructions_and_state_changes(folder: Path, tmp_path: Path) -> None:
    write_lines(folder, [good(episode="a"), good(episode="a", ML=-1, SC=4), good()])
    prepare(folder, tmp_path / "data", size=SIZE)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert (manifest["format"], manifest["episodes"], manifest["clips"]) == ("animegamer-clips", 2, 3)
    assert (manifest["frames"], manifest["fps"], manifest["height"], manifest["width"]) == (17, 8, *SIZE)
    episodes = [json.loads(line) for line in (tmp_path / "data" / "episodes.jsonl").read_text().splitlines()]
    assert [len(e["turns"]) for e in episodes] == [2, 1]
    assert episodes[0]["turns"][1]["deltas"] == {"motion": -1, "social": 4, "entertainment": 2, "stamina": -2}
    assert episodes[0]["turns"][1]["source"] == {"file": "clips/counter.mp4", "start": 1.0, "line": 2}


def test_prepare_with_a_bad_line_writes_nothing(folder: Path, tmp_path: Path) -> None:
    write_lines(folder, [good(), good(ET=-8)])
    with pytest.raises(DatasetError, match="line 2: field 'ET'"):
        prepare(folder, tmp_path / "data", size=SIZE)
    assert not (tmp_path / "data").exists()
    assert not list(tmp_path.glob(".data*"))


def test_prepare_refuses_a_folder_that_holds_something(folder: Path, tmp_path: Path) -> None:
    write_lines(folder, [good()])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "kept.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not empty"):
        prepare(folder, tmp_path / "data", size=SIZE)
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["kept.txt"]


def test_the_commands_answer_with_the_bad_lines_or_what_was_written(folder: Path, tmp_path: Path, capsys) -> None:
    write_lines(folder, [good(), good(SC=6)])
    assert main(["data", "check", str(folder)]) == 1
    assert "line 2: field 'SC'" in capsys.readouterr().err
    write_lines(folder, [good()])
    assert main(["data", "check", str(folder)]) == 0
    assert main(["data", "prepare", str(folder), "--out", str(tmp_path / "data"), "--size", "64x96"]) == 0
    assert "Wrote 1 episodes, 1 clips at 64x96" in capsys.readouterr().out
    assert main(["data", "prepare", str(folder), "--out", str(tmp_path / "other"), "--size", "65x96"]) == 1
    assert "multiples of 16" in capsys.readouterr().err


def test_a_video_cut_after_its_header_fails_prepare_and_leaves_nothing(folder: Path, tmp_path: Path) -> None:
    """The header (moov, at the front) is whole, so the check passes; the frames are cut, so the decode fails
    midway, after the first clip was written to the hidden work folder."""
    whole = (folder / "clips" / "counter.mp4").read_bytes()
    (folder / "cut.mp4").write_bytes(whole[: len(whole) * 6 // 10])  # past the header, into the frames
    write_lines(folder, [good(), good(file="cut.mp4", start=1.5, end=4.0)])
    assert check(folder).ok
    with pytest.raises(DatasetError, match=r"^line 2: .*Invalid data"):
        prepare(folder, tmp_path / "data", size=SIZE)
    assert not (tmp_path / "data").exists() and not list(tmp_path.glob(".data*"))
