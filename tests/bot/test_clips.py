"""The bot's own MP4 work: shrinking to an upload limit and joining a story's clips."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest

from bot.clips import ClipTooLarge, fit_to_size, join_clips, probe

FRAMES = 17  # one turn's clip
FPS = 8


def _make_clip(width: int, height: int, seed: int, block: int = 1) -> bytes:
    """A clip of noise in `block`-pixel squares: big for its size, yet not so random that shrinking it is slow."""
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, FPS)
        stream.options = {"crf": "18", "preset": "ultrafast"}
        for index in range(FRAMES):
            noise = rng.integers(0, 256, size=(height // block, width // block, 3), dtype=np.uint8)
            rgb = noise.repeat(block, axis=0).repeat(block, axis=1)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def _decoded_frames(mp4: bytes) -> int:
    with av.open(io.BytesIO(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


@pytest.fixture(scope="module")
def small_clip() -> bytes:
    return _make_clip(64, 96, seed=1)


@pytest.fixture(scope="module")
def large_clip() -> bytes:
    return _make_clip(480, 720, seed=2, block=16)


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


def test_joined_clips_hold_every_frame_at_the_first_clips_size(small_clip: bytes) -> None:
    other = _make_clip(128, 64, seed=3)
    joined = join_clips([small_clip, other, small_clip])
    info = probe(joined)
    assert _decoded_frames(joined) == 3 * FRAMES
    assert (info["width"], info["height"]) == (64, 96)


def test_joining_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one clip"):
        join_clips([])
