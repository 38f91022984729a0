"""The bot's MP4 work: joining a story's clips and fitting a clip under the server's upload limit.

Every function here is CPU-bound and blocking: call it through `asyncio.to_thread`. Output is the workers' own
(media/mp4.py's encoder), so a recap looks like the clips it is made of and the same input gives the same bytes.

Memory stays bounded whatever the story's length: files are read and written by path, packets are copied one at a
time, and a re-encode holds one decoded frame plus x264's own lookahead, never a clip's (or a story's) frame list.
A 100-turn recap at 480x720 once decoded into a list took about 880 MB; `benchmarks/recap_memory.py` measures it now.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain
from pathlib import Path
from typing import Literal

import av
from av.video.stream import VideoStream

from media.mp4 import CRF, encode, frame_rate, probe, video_stream

logger = logging.getLogger(__name__)

FIT_TRIES = 2  # a re-encode at the bitrate the limit allows, then one more aimed lower by how far the first missed
FIT_HEADROOM = 0.92  # of the limit the video may take: x264's average bitrate overshoots a little on short clips
MP4_OVERHEAD_BYTES = 2048 + 16  # the moov header, plus per frame (below) its sample table entries
MP4_BYTES_PER_FRAME = 16
MIN_BITS_PER_PIXEL = 0.05  # below this per frame, smaller frames look better than blockier ones
MIN_SCALE = 0.25


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
class _Layout:
    """What two clips must share for their packets to be copied into one file without decoding."""

    codec: str
    width: int
    height: int
    pix_fmt: str
    extradata: bytes  # H.264's SPS/PPS: same encoder settings give the same bytes
    time_base: Fraction
    rate: Fraction


def _layout(path: Path) -> _Layout:
    with av.open(str(path), mode="r") as container:
        stream = video_stream(container)
        ctx = stream.codec_context
        return _Layout(
            codec=ctx.name,
            width=int(ctx.width),
            height=int(ctx.height),
            pix_fmt=str(ctx.pix_fmt),
            extradata=bytes(ctx.extradata or b""),
            time_base=Fraction(stream.time_base or 0),
            rate=frame_rate(stream),
        )


def _even(value: float) -> int:
    """yuv420p needs even dimensions; never below 2."""
    return max(2, round(value / 2) * 2)


def _decoded(paths: Sequence[Path]) -> Iterator[av.VideoFrame]:
    """Every frame of every clip in order, decoded one at a time as the encoder asks for it."""
    for path in paths:
        with av.open(str(path), mode="r") as container:
            stream = video_stream(container)
            stream.thread_type = "SLICE"  # frame threads would hold several decoded frames each
            yield from container.decode(stream)


def _copy(paths: Sequence[Path], out: Path) -> None:
    """Remux every clip's packets into one file, each clip's timestamps moved to start where the last one ended."""
    with av.open(str(out), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
        target: VideoStream | None = None
        next_start = 0  # in the clips' shared time base: where the next clip's first frame is shown
        last_dts: int | None = None
        for path in paths:
            with av.open(str(path), mode="r") as source:
                stream = video_stream(source)
                if target is None:
                    target = container.add_stream_from_template(stream)
                frame_ticks = max(1, round(1 / (frame_rate(stream) * stream.time_base)))
                packets = (packet for packet in source.demux(stream) if packet.dts is not None)
                first = next(packets, None)
                if first is None:
                    continue
                assert first.pts is not None and first.dts is not None, "a demuxed packet has timestamps"
                start = stream.start_time if stream.start_time is not None else first.pts
                # Shown right after the last clip, and decoded after it too (B-frames put dts before pts).
                shift = next_start - start
                if last_dts is not None:
                    shift = max(shift, last_dts + 1 - first.dts)
                for packet in chain([first], packets):
                    assert packet.pts is not None and packet.dts is not None
                    packet.pts += shift
                    packet.dts += shift
                    next_start = max(next_start, packet.pts + (packet.duration or frame_ticks))
                    last_dts = packet.dts
                    packet.stream = target
                    container.mux(packet)
        if target is None:
            raise ValueError("the MP4 holds no video frames")


def join_files(paths: Sequence[Path], out: Path) -> Literal["copy", "encode"]:
    """One MP4 of every clip in order, written to `out`; says how it was made.

    Clips from one worker configuration share their encoding, and their packets are copied as they are: no decode,
    no quality lost, seconds for a long story. Otherwise every frame is re-encoded at the first clip's size and frame
    rate, one frame at a time.
    """
    if not paths:
        raise ValueError("join_files needs at least one clip")
    layouts = [_layout(path) for path in paths]
    first = layouts[0]
    if first.codec == "h264" and first.pix_fmt == "yuv420p" and all(layout == first for layout in layouts):
        _copy(paths, out)
        return "copy"
    width, height = _even(first.width), _even(first.height)
    encode(_decoded(paths), out, first.rate, width, height, {"crf": str(CRF)})
    return "encode"


def _fit_size(bitrate: float, width: int, height: int, fps: Fraction) -> tuple[int, int]:
    """Frames as large as the bitrate can fill: below MIN_BITS_PER_PIXEL a smaller picture looks better."""
    bits_per_pixel = bitrate / (width * height * float(fps))
    scale = min(1.0, max(MIN_SCALE, (bits_per_pixel / MIN_BITS_PER_PIXEL) ** 0.5))
    return _even(width * scale), _even(height * scale)


def fit_file(src: Path, limit_bytes: int, out: Path) -> Path:
    """`src` itself if it fits the upload limit, else a re-encode into `out` that does.

    The bitrate comes from the clip's duration and the limit; a re-encode that still misses is tried once more at a
    bitrate lowered by how far it missed. Frame rate and frame count are kept, so a shrunk clip plays as long as the
    original. Raises ClipTooLarge when neither try fits: a clip is never dropped silently.
    """
    if limit_bytes < 1:
        raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
    size = src.stat().st_size
    if size <= limit_bytes:
        return src
    info = probe(src)
    fps = Fraction(info["fps"]).limit_denominator(1001)
    seconds = info["frames"] / float(fps)
    budget = limit_bytes - MP4_OVERHEAD_BYTES - MP4_BYTES_PER_FRAME * info["frames"]
    bitrate = max(1000.0, budget * 8 * FIT_HEADROOM / seconds)
    smallest = size
    for attempt in range(1, FIT_TRIES + 1):
        width, height = _fit_size(bitrate, info["width"], info["height"], fps)
        # A VBV cap keeps x264's average from drifting far above the target on a short clip.
        vbv = {"maxrate": str(int(bitrate * 1.5)), "bufsize": str(int(bitrate * 2))}
        encode(_decoded([src]), out, fps, width, height, vbv, bit_rate=int(bitrate))
        got = out.stat().st_size
        smallest = min(smallest, got)
        logger.info(
            "re-encode %d of %d: %d bytes at %d bit/s, %dx%d, for a %d-byte limit (was %d bytes)",
            attempt, FIT_TRIES, got, int(bitrate), width, height, limit_bytes, size,
        )  # fmt: skip
        if got <= limit_bytes:
            return out
        bitrate = max(1000.0, bitrate * limit_bytes / got * FIT_HEADROOM)
    raise ClipTooLarge(size, smallest, limit_bytes)


def fit_to_size(mp4: bytes, limit_bytes: int) -> bytes:
    """The clip itself if it fits the upload limit, else its re-encode that does (see `fit_file`)."""
    if limit_bytes < 1:
        raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
    if len(mp4) <= limit_bytes:
        return mp4
    # faststart rewrites the file by name after the last packet, which a BytesIO cannot do.
    with tempfile.TemporaryDirectory(prefix="animegamer-bot-mp4-") as tmp:
        src = Path(tmp, "clip.mp4")
        src.write_bytes(mp4)
        return fit_file(src, limit_bytes, Path(tmp, "fitted.mp4")).read_bytes()
