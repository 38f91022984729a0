"""MP4 in and out with PyAV: the one encoder every clip is written with, a decoder and a probe.

Clips are H.264 / yuv420p with the index (moov) at the front, the combination that plays inline in browsers and in
Discord's client without a download. Encoding is deterministic so that a retried turn with the same seed yields the
same bytes, and a recap or a shrunk clip the same bytes for the same clips.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path
from typing import TypedDict

import av
import numpy as np
from av.video.frame import PictureType
from av.video.stream import VideoStream

CRF = 20  # visually near-lossless for 480p anime frames, a 17-frame clip stays well under Discord's upload limit
PRESET = "medium"
# Measured here: with x264's macroblock-tree rate control on, the same frames gave different bytes
# from run to run in a process that had run the model (1 run in 8 identical); with it off, and
# the encoder's and lookahead's threads pinned to one, 8 in 8. One thread also bounds memory: x264's
# frame threads would each hold frames of their own.
X264_PARAMS = "threads=1:lookahead-threads=1:mbtree=0"


class ClipInfo(TypedDict):
    codec: str
    pix_fmt: str
    frames: int
    width: int
    height: int
    fps: float


def encode(
    frames: Iterable[av.VideoFrame],
    out: Path,
    fps: Fraction,
    width: int,
    height: int,
    rate: dict[str, str],
    bit_rate: int | None = None,
) -> int:
    """H.264 / yuv420p / faststart at `width` x `height` into `out`; returns the frames written.

    `rate` is x264's rate control: a CRF, or with `bit_rate` (bits per second) a VBV cap. Each frame is converted
    to the output size and format as it arrives, so memory does not grow with the number of frames.
    """
    written = 0
    with av.open(str(out), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = width
        stream.height = height
        stream.pix_fmt = "yuv420p"
        stream.time_base = 1 / fps
        stream.codec_context.thread_count = 1  # output independent of the machine's core count
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        stream.options = {"preset": PRESET, "x264-params": X264_PARAMS, **rate}
        for source in frames:
            frame = source.reformat(width=width, height=height, format="yuv420p")
            frame.pict_type = PictureType.NONE  # let x264 choose frame types, not a source decoder's
            frame.pts = written
            frame.time_base = 1 / fps
            container.mux(stream.encode(frame))
            written += 1
        container.mux(stream.encode())  # flush the frames x264 still holds
    if not written:
        raise ValueError("the MP4 holds no video frames")
    return written


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
    """Encode RGB frames `(T, H, W, 3)` uint8 into MP4 bytes at the clips' quality (CRF)."""
    _check_frames(frames, fps)
    _, height, width, _ = frames.shape
    rgb = (av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24") for frame in frames)
    # faststart moves moov before mdat by reopening the output by name after writing, which an in-memory buffer
    # cannot do, so the clip goes through a temporary file.
    with tempfile.TemporaryDirectory(prefix="animegamer-mp4-") as tmp:
        path = Path(os.path.join(tmp, "clip.mp4"))
        encode(rgb, path, Fraction(fps), width, height, {"crf": str(CRF)})
        return path.read_bytes()


def decode_mp4(data: bytes) -> np.ndarray:
    """Decode MP4 bytes into RGB frames `(T, H, W, 3)` uint8."""
    with av.open(io.BytesIO(data), mode="r") as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames:
        raise ValueError("the MP4 holds no video frames")
    return np.stack(frames)


def video_stream(container: av.container.InputContainer) -> VideoStream:
    if not container.streams.video:
        raise ValueError("the MP4 holds no video stream")
    return container.streams.video[0]


def frame_rate(stream: VideoStream) -> Fraction:
    return Fraction(stream.average_rate or stream.guessed_rate or 8)  # a guess only for a rateless stream


def probe(mp4: bytes | Path) -> ClipInfo:
    """Codec, pixel format, frame count, size and frame rate of the first video stream, without ffprobe."""
    source = str(mp4) if isinstance(mp4, Path) else io.BytesIO(mp4)
    with av.open(source, mode="r") as container:
        stream = video_stream(container)
        ctx = stream.codec_context
        num_frames = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
        return ClipInfo(
            codec=ctx.name,
            pix_fmt=str(ctx.pix_fmt),
            frames=int(num_frames),
            width=int(ctx.width),
            height=int(ctx.height),
            fps=float(frame_rate(stream)),
        )
