"""The bot's own MP4 work: shrinking to an upload limit and joining a story's clips."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import av
import pytest

from media.clips import FIT_TRIES, ClipTooLarge, fit_file, fit_to_size, join_files
from media.mp4 import probe
from tests.bot.clip_samples import FPS, FRAMES, noise_clip, painted_clip


def _decoded_frames(mp4: bytes | Path) -> int:
    with av.open(str(mp4) if isinstance(mp4, Path) else io.BytesIO(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


def _packets(path: Path) -> list[bytes]:
    with av.open(str(path)) as container:
        return [bytes(packet) for packet in container.demux(video=0) if packet.size]


def _re_encodes(caplog: pytest.LogCaptureFixture) -> int:
    return sum(record.getMessage().startswith("re-encode") for record in caplog.records)


@pytest.fixture(scope="module")
def small_clip() -> bytes:
    return noise_clip(64, 96, seed=1)


@pytest.fixture(scope="module")
def large_clip() -> bytes:
    return noise_clip(480, 720, seed=2, block=16)


@pytest.fixture
def files(tmp_path: Path):
    def write(*clips: bytes) -> list[Path]:
        paths = [tmp_path / f"clip_{index}.mp4" for index in range(len(clips))]
        for path, clip in zip(paths, clips, strict=True):
            path.write_bytes(clip)
        return paths

    return write


def test_a_clip_that_fits_is_returned_unchanged(small_clip: bytes) -> None:
    assert fit_to_size(small_clip, len(small_clip)) is small_clip


def test_a_clip_over_the_limit_comes_back_smaller_playable_and_as_long(large_clip: bytes) -> None:
    limit = len(large_clip) // 2
    shrunk = fit_to_size(large_clip, limit)
    info = probe(shrunk)
    assert len(shrunk) <= limit
    assert _decoded_frames(shrunk) == FRAMES
    assert (info["codec"], info["pix_fmt"], info["fps"]) == ("h264", "yuv420p", FPS)
    assert info["width"] % 2 == 0 and info["height"] % 2 == 0


def test_shrinking_is_deterministic(large_clip: bytes) -> None:
    limit = len(large_clip) // 2
    assert fit_to_size(large_clip, limit) == fit_to_size(large_clip, limit)


def test_an_impossible_limit_raises_clip_too_large_with_the_sizes(small_clip: bytes) -> None:
    with pytest.raises(ClipTooLarge) as caught:
        fit_to_size(small_clip, 100)
    assert caught.value.limit_bytes == 100
    assert caught.value.original_bytes == len(small_clip)
    assert str(len(small_clip)) in str(caught.value)


def test_a_clip_that_cannot_fit_is_re_encoded_twice_at_most(
    small_clip: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="media.clips")
    with pytest.raises(ClipTooLarge):
        fit_to_size(small_clip, 100)
    assert _re_encodes(caplog) == FIT_TRIES == 2


def test_a_joined_recap_over_the_limit_is_re_encoded_once_to_fit_and_keeps_every_frame(
    files, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    joined = tmp_path / "joined.mp4"
    join_files(files(*(painted_clip(seed) for seed in range(4))), joined)
    limit = joined.stat().st_size // 2
    caplog.set_level(logging.INFO, logger="media.clips")
    fitted = fit_file(joined, limit, tmp_path / "fitted.mp4")
    assert fitted.stat().st_size <= limit
    assert _decoded_frames(fitted) == 4 * FRAMES
    assert _re_encodes(caplog) == 1


def test_a_file_that_fits_is_its_own_fit(files, tmp_path: Path) -> None:
    (clip,) = files(painted_clip(0))
    assert fit_file(clip, clip.stat().st_size, tmp_path / "fitted.mp4") == clip
    assert not (tmp_path / "fitted.mp4").exists()


def test_clips_of_one_encoding_are_joined_by_copying_their_packets(files, tmp_path: Path) -> None:
    clips = files(painted_clip(1), painted_clip(2), painted_clip(1))
    joined = tmp_path / "joined.mp4"
    assert join_files(clips, joined) == "copy"
    assert _packets(joined) == [packet for clip in clips for packet in _packets(clip)]
    info = probe(joined)
    assert _decoded_frames(joined) == 3 * FRAMES
    assert (info["frames"], info["fps"], info["width"], info["height"]) == (3 * FRAMES, FPS, 720, 480)


def test_a_copied_join_plays_its_frames_evenly_from_zero(files, tmp_path: Path) -> None:
    joined = tmp_path / "joined.mp4"
    join_files(files(painted_clip(1), painted_clip(2)), joined)
    with av.open(str(joined)) as container:
        times = [frame.time for frame in container.decode(video=0)]
    assert times == pytest.approx([index / FPS for index in range(2 * FRAMES)])


def test_mixed_size_clips_are_joined_frame_by_frame_at_the_first_clips_size(
    files, small_clip: bytes, tmp_path: Path
) -> None:
    joined = tmp_path / "joined.mp4"
    how = join_files(files(small_clip, noise_clip(128, 64, seed=3), painted_clip(4, 96, 64), small_clip), joined)
    info = probe(joined)
    assert how == "encode"
    assert _decoded_frames(joined) == 4 * FRAMES
    assert (info["width"], info["height"], info["fps"]) == (64, 96, FPS)


def test_joining_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one clip"):
        join_files([], tmp_path / "joined.mp4")
