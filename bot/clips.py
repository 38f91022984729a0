"""MP4 work the bot does itself: shrinking a clip to the server's upload limit and joining a story's clips.

The bot never imports the worker (which pulls in torch), so this is its own small PyAV code. Every function here is
CPU-bound and blocking: call it through `asyncio.to_thread`. Output follows the worker's conventions, H.264 / yuv420p
with the index at the front so Discord plays it inline, and encoding is deterministic so the same input gives the
same bytes.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain
from typing import TypedDict

import av
from av.video.frame import PictureType

logger = logging.getLogger(__name__)

JOIN_CRF = 20  # the worker's quality: a recap should look like the clips it is made of
PRESET = "medium"
# Without these, x264's macroblock-tree rate control and threading gave different bytes run to run.
X264_PARAMS = "threads=1:lookahead-threads=1:mbtree=0"
# (scale, CRF) tried in order: a higher CRF first, since it keeps the size players expect; then smaller frames.
SHRINK_STEPS: tuple[tuple[float, int], ...] = (
    (1.0, 28),
    (1.0, 34),
    (1.0, 40),
    (0.75, 40),
    (0.5, 40),
    (0.25, 51),
)


class ClipInfo(TypedDict):
    codec: str
    pix_fmt: str
    frames: int
    width: int
    height: int
    fps: float


class ClipTooLarge(Exception):
    """Even the smallest re-encode is over the limit; the caller tells the player rather than posting nothing."""

    def __init__(self, original_bytes: int, smallest_bytes: int, limit_bytes: int) -> None:
        # Arguments go to Exception.__init__ so the error pickles and reprs with its numbers.
        super().__init__(original_bytes, smallest_bytes, limit_bytes)
        self.original_bytes = original_bytes
        self.smallest_bytes = smallest_bytes
        self.limit_bytes = limit_bytes

    def __str__(self) -> str:
        return (
            f"clip is {self.original_bytes} bytes and its smallest re-encode {self.smallest_bytes} bytes, "
            f"over the {self.limit_bytes}-byte upload limit; raise the limit (boost the server) or post a link"
        )


@dataclass(frozen=True)
class _Clip:
    frames: list[av.VideoFrame]  # decoded frames, kept as the decoder gave them (no RGB round trip)
    fps: Fraction
    width: int
    height: int


def probe(mp4: bytes) -> ClipInfo:
    """Codec, pixel format, frame count, size and frame rate of the first video stream, without ffprobe."""
    with av.open(io.BytesIO(mp4), mode="r") as container:
        if not container.streams.video:
            raise ValueError("the MP4 holds no video stream")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        rate = stream.average_rate or stream.guessed_rate
        num_frames = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
        return ClipInfo(
            codec=ctx.name,
            pix_fmt=str(ctx.pix_fmt),
            frames=int(num_frames),
            width=int(ctx.width),
            height=int(ctx.height),
            fps=float(rate) if rate else 0.0,
        )


def _decode(mp4: bytes) -> _Clip:
    with av.open(io.BytesIO(mp4), mode="r") as container:
        if not container.streams.video:
            raise ValueError("the MP4 holds no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate or Fraction(8)  # a guess only for a rateless stream
        frames = list(container.decode(stream))
    if not frames:
        raise ValueError("the MP4 holds no video frames")
    return _Clip(frames=frames, fps=Fraction(rate), width=frames[0].width, height=frames[0].height)


def _frames(clips: Iterable[bytes]) -> Iterator[av.VideoFrame]:
    """Every frame of every clip, one clip in memory at a time: a long story's recap would not fit otherwise."""
    for mp4 in clips:
        yield from _decode(mp4).frames


def _even(value: float) -> int:
    """yuv420p needs even dimensions; never below 2."""
    return max(2, round(value / 2) * 2)


def _encode(frames: Iterable[av.VideoFrame], fps: Fraction, width: int, height: int, crf: int) -> bytes:
    """H.264 / yuv420p / faststart at `width` x `height`, each frame scaled to it when its size differs."""
    # faststart rewrites the file by name after the last packet, which a BytesIO cannot do.
    with tempfile.TemporaryDirectory(prefix="animegamer-bot-mp4-") as tmp:
        path = os.path.join(tmp, "clip.mp4")
        with av.open(path, mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
            stream = container.add_stream("libx264", rate=fps)
            stream.width = width
            stream.height = height
            stream.pix_fmt = "yuv420p"
            stream.time_base = 1 / fps
            stream.codec_context.thread_count = 1  # output independent of the machine's core count
            stream.options = {"crf": str(crf), "preset": PRESET, "x264-params": X264_PARAMS}
            for index, decoded in enumerate(frames):
                frame = decoded.reformat(width=width, height=height, format="yuv420p")
                frame.pict_type = PictureType.NONE  # let x264 choose frame types, not the source's decoder
                frame.pts = index
                frame.time_base = 1 / fps
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():  # flush the frames x264 still holds
                container.mux(packet)
        with open(path, "rb") as f:
            return f.read()


def fit_to_size(mp4: bytes, limit_bytes: int) -> bytes:
    """The clip itself if it fits the upload limit, else the first smaller re-encode that does.

    Frame rate and frame count are kept, so a shrunk clip plays as long as the original. Raises ClipTooLarge when
    even the last step of SHRINK_STEPS is over the limit: a clip is never dropped silently.
    """
    if limit_bytes < 1:
        raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
    if len(mp4) <= limit_bytes:
        return mp4
    clip = _decode(mp4)
    smallest = len(mp4)
    for scale, crf in SHRINK_STEPS:
        width, height = _even(clip.width * scale), _even(clip.height * scale)
        candidate = _encode(clip.frames, clip.fps, width, height, crf)
        smallest = min(smallest, len(candidate))
        if len(candidate) <= limit_bytes:
            logger.info(
                "shrank a clip from %d to %d bytes (%dx%d, CRF %d) to fit %d bytes",
                len(mp4), len(candidate), width, height, crf, limit_bytes,
            )  # fmt: skip
            return candidate
    raise ClipTooLarge(len(mp4), smallest, limit_bytes)


def join_clips(clips: list[bytes]) -> bytes:
    """One MP4 of every clip in order, for a story's recap; every frame takes the first clip's size and frame rate."""
    if not clips:
        raise ValueError("join_clips needs at least one clip")
    first = _decode(clips[0])
    frames = chain(first.frames, _frames(clips[1:]))
    return _encode(frames, first.fps, _even(first.width), _even(first.height), JOIN_CRF)
