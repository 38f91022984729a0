"""MP4 encoding: what Discord and browsers need, and that it is repeatable."""

from __future__ import annotations

import subprocess
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from media.mp4 import decode_mp4, encode_mp4, probe


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    # 17 frames of 64x96: a moving gradient, so the codec has real content to compress
    t, y, x = np.meshgrid(np.arange(17), np.arange(64), np.arange(96), indexing="ij")
    rgb = np.stack([(x * 2 + t * 8) % 256, (y * 4) % 256, (x + y + t * 4) % 256], axis=-1)
    return rgb.astype(np.uint8)


@pytest.fixture(scope="module")
def clip(frames: np.ndarray) -> bytes:
    return encode_mp4(frames, fps=8)


def test_round_trip_keeps_frame_count_and_size(frames: np.ndarray, clip: bytes) -> None:
    decoded = decode_mp4(clip)
    assert decoded.shape == frames.shape == (17, 64, 96, 3)
    assert decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - frames.astype(int)).mean() < 6  # lossy but close


def test_clip_is_h264_yuv420p_at_the_requested_rate(clip: bytes) -> None:
    assert probe(clip) == {"codec": "h264", "pix_fmt": "yuv420p", "frames": 17, "width": 96, "height": 64, "fps": 8}


def test_index_comes_before_the_media_data_for_inline_playback(clip: bytes) -> None:
    assert 0 <= clip.find(b"moov") < clip.find(b"mdat")


def test_same_frames_give_the_same_bytes(frames: np.ndarray, clip: bytes) -> None:
    assert encode_mp4(frames.copy(), fps=8) == clip


def test_bundled_ffmpeg_reads_the_clip_without_errors(clip: bytes, tmp_path: Path) -> None:
    path = tmp_path / "clip.mp4"
    path.write_bytes(clip)
    result = subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-f", "null", "-"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert result.stderr.strip() == ""


def test_odd_width_is_rejected(frames: np.ndarray) -> None:
    with pytest.raises(ValueError, match="even"):
        encode_mp4(frames[:, :, :95], fps=8)


def test_frames_that_are_not_uint8_rgb_are_rejected(frames: np.ndarray) -> None:
    with pytest.raises(ValueError, match="uint8"):
        encode_mp4(frames.astype(np.float32), fps=8)
    with pytest.raises(ValueError, match="shape"):
        encode_mp4(frames[..., :2], fps=8)
