"""MP4 in and out, in memory, with PyAV.

Clips are H.264 / yuv420p with the index (moov) at the front, the combination that plays inline in browsers and in
Discord's client without a download. Encoding is deterministic so that a retried turn with the same seed yields the
same bytes.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from fractions import Fraction
from typing import TypedDict

import av
import numpy as np

logger = logging.getLogger(__name__)

CRF = 20  # visually near-lossless for 480p anime frames, a 17-frame clip stays well under Discord's upload limit
PRESET = "medium"
# Measured here: with x264's macroblock-tree rate control on, the same frames gave different bytes
# from run to run in a process that had run the model (1 run in 8 identical); with it off, and
# the encoder's and lookahead's threads pinned to one, 8 in 8. The same seed must give the same clip.
X264_PARAMS = "threads=1:lookahead-threads=1:mbtree=0"


class MP4Info(TypedDict):
    codec: str
    pix_fmt: str
    frames: int
    width: int
    height: int
    fps: float


def _check_frames(frames: np.ndarray, fps: int) -> None:
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8:
        raise ValueError("frames must be a uint8 numpy array of shape (T, H, W, 3)")
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] < 1:
        raise ValueError(f"frames must have shape (T>=1, H, W, 3), got {frames.shape}")
    _, height, width, _ = frames.shape
    if height % 2 or width % 2:
        raise ValueError(f"yuv420p needs an even width and height, got {width}x{height}; crop or pad by one pixel")
    if not isinstance(fps, int) or fps < 1:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")


def encode_mp4(frames: np.ndarray, fps: int) -> bytes:
    """Encode RGB frames `(T, H, W, 3)` uint8 into MP4 bytes (H.264, yuv420p, faststart)."""
    _check_frames(frames, fps)

    # faststart moves moov before mdat by reopening the output by name after writing, which an in-memory buffer
    # cannot do, so the clip goes through a temporary file.
    with tempfile.TemporaryDirectory(prefix="animegamer-mp4-") as tmp:
        path = os.path.join(tmp, "clip.mp4")
        _write_mp4(path, frames, fps)
        with open(path, "rb") as f:
            return f.read()


def _write_mp4(path: str, frames: np.ndarray, fps: int) -> None:
    _, height, width, _ = frames.shape
    with av.open(path, mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = width
        stream.height = height
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        # One encoder thread: x264 output is then independent of the machine's core count.
        stream.codec_context.thread_count = 1
        stream.options = {"crf": str(CRF), "preset": PRESET, "x264-params": X264_PARAMS}
        for index, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = index
            frame.time_base = Fraction(1, fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():  # flush delayed frames
            container.mux(packet)


def decode_mp4(data: bytes) -> np.ndarray:
    """Decode MP4 bytes into RGB frames `(T, H, W, 3)` uint8."""
    with av.open(io.BytesIO(data), mode="r") as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames:
        raise ValueError("the MP4 holds no video frames")
    return np.stack(frames)


def probe_mp4(data: bytes) -> MP4Info:
    """Codec, pixel format, frame count, size and frame rate of the first video stream (no ffprobe needed)."""
    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.video:
            raise ValueError("the MP4 holds no video stream")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        rate = stream.average_rate or stream.guessed_rate
        num_frames = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
        return MP4Info(
            codec=ctx.name,
            pix_fmt=str(ctx.pix_fmt),
            frames=int(num_frames),
            width=int(ctx.width),
            height=int(ctx.height),
            fps=float(rate) if rate else 0.0,
        )
