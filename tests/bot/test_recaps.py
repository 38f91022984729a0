"""A story's recap: made once per version of the story, in bounded memory, kept in the clip store, cleaned up."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import av
import pytest

from bot.clip_store import FolderStore
from bot.recaps import forget, recap_file
from media.clips import ClipTooLarge
from tests.bot.clip_samples import FRAMES, story_clips

ROOT = Path(__file__).resolve().parents[2]
PEAK_LIMIT_BYTES = 300 * 1024 * 1024
TURNS = 50  # a long story: its clips together are over a server's upload limit, so the recap is re-encoded
SERVER_LIMIT = 10 * 1024 * 1024 - 64 * 1024  # a server without boosts, less the bot's room for the message

# Run in a process of its own so its peak memory is the recap's alone: the kernel's high-water mark (VmHWM).
RECAP_IN_A_PROCESS = """
import sys
from pathlib import Path
from bot.clip_store import FolderStore
from bot.recaps import recap_file
folder, turns, limit = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
clips = [(turn, f"job_{turn}.mp4") for turn in range(1, turns + 1)]
(folder / "work").mkdir()
path, _ = recap_file(FolderStore(folder), 1, clips, limit, folder / "work")
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
print(path, int(status["VmHWM"].split()[0]) * 1024)
"""


def _turns(paths: list[Path]) -> list[tuple[int, str]]:
    return [(turn, str(path)) for turn, path in enumerate(paths, start=1)]  # an absolute key reads as itself


def _re_encodes(caplog: pytest.LogCaptureFixture) -> int:
    return sum(record.getMessage().startswith("re-encode") for record in caplog.records)


def _encodes(caplog: pytest.LogCaptureFixture) -> int:
    return sum("recap of" in record.getMessage() for record in caplog.records)


@pytest.fixture
def clips(tmp_path: Path) -> list[Path]:
    return story_clips(tmp_path / "clips", turns=4)


@pytest.fixture
def store(tmp_path: Path) -> FolderStore:
    return FolderStore(tmp_path / "store")


@pytest.fixture
def work(tmp_path: Path) -> Callable[[], Path]:
    """A fresh folder per recap asked for, as the story cog gives each one."""
    count = iter(range(100))

    def fresh() -> Path:
        folder = tmp_path / f"work{next(count)}"
        folder.mkdir()
        return folder

    return fresh


def recaps(store: FolderStore) -> list[str]:
    return store.keys("recaps/")


def test_a_second_recap_of_the_same_turns_reuses_the_kept_one_without_encoding(
    clips: list[Path], store: FolderStore, work, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bot.recaps")
    first, made = recap_file(store, 7, _turns(clips), SERVER_LIMIT, work())
    again, made_again = recap_file(store, 7, _turns(clips), SERVER_LIMIT, work())
    assert (made, made_again) == (True, False)
    assert again.read_bytes() == first.read_bytes()
    assert _encodes(caplog) == 1 and len(recaps(store)) == 1


def test_a_new_turn_makes_a_new_recap_and_deletes_the_old_one(clips: list[Path], store: FolderStore, work) -> None:
    recap_file(store, 7, _turns(clips[:3]), SERVER_LIMIT, work())
    (old,) = recaps(store)
    new, made = recap_file(store, 7, _turns(clips), SERVER_LIMIT, work())
    assert made and recaps(store) != [old] and len(recaps(store)) == 1
    with av.open(str(new)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 4 * FRAMES


def test_a_removed_turn_makes_a_new_recap_even_when_the_last_turn_is_the_same(
    clips: list[Path], store: FolderStore, work
) -> None:
    recap_file(store, 7, _turns(clips), SERVER_LIMIT, work())
    (whole,) = recaps(store)
    _, made = recap_file(store, 7, [turn for turn in _turns(clips) if turn[0] != 2], SERVER_LIMIT, work())
    assert made and whole not in recaps(store)


def test_a_recap_too_large_even_re_encoded_is_remembered_not_encoded_again(
    clips: list[Path], store: FolderStore, work, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="media.clips")
    with pytest.raises(ClipTooLarge) as first:
        recap_file(store, 7, _turns(clips[:2]), 1000, work())
    tries = _re_encodes(caplog)
    with pytest.raises(ClipTooLarge) as again:
        recap_file(store, 7, _turns(clips[:2]), 1000, work())
    assert tries == 2 and _re_encodes(caplog) == tries
    assert str(again.value) == str(first.value)


def test_forgetting_a_story_deletes_its_recaps_and_no_other_storys(clips: list[Path], store: FolderStore, work) -> None:
    recap_file(store, 1, _turns(clips[:1]), SERVER_LIMIT, work())
    recap_file(store, 12, _turns(clips[:1]), SERVER_LIMIT, work())
    forget(store, 1)
    assert [key.split("_")[1] for key in recaps(store)] == ["12"]


@pytest.mark.slow  # one re-encode of 850 frames at 720x480: about 18 s on one core
def test_a_50_turn_recap_over_the_limit_is_made_in_under_300_mb_with_every_frame(tmp_path: Path) -> None:
    """850 frames at 720x480 are 880 MB decoded: a recap that held them (or the joined clip's) would pass 300 MB."""
    story_clips(tmp_path, turns=TURNS)
    joined_bytes = sum(path.stat().st_size for path in tmp_path.glob("job_*.mp4"))
    assert joined_bytes > SERVER_LIMIT  # so the recap is re-encoded, the step that once held every frame
    run = subprocess.run(
        [sys.executable, "-c", RECAP_IN_A_PROCESS, str(tmp_path), str(TURNS), str(SERVER_LIMIT)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    path, peak = run.stdout.split()
    with av.open(path) as container:
        frames = sum(1 for _ in container.decode(video=0))
    assert int(peak) < PEAK_LIMIT_BYTES
    assert Path(path).stat().st_size <= SERVER_LIMIT
    assert frames == TURNS * FRAMES
