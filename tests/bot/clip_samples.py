"""Clips to test the bot's MP4 work with, made here with PyAV (no worker, no model).

`painted_clip` looks like a turn's clip to the encoder: flat painted regions, a few figures moving, a little grain,
encoded with the worker's settings (H.264 CRF 20, preset medium, 8 fps, faststart), about 245 KB at 720x480.
`noise_clip` is the opposite, big for its size, for shrinking.
"""

from __future__ import annotations

import functools
import io
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

FRAMES = 17  # one turn's clip
FPS = 8
WIDTH, HEIGHT = 720, 480  # the published model's clips
WORKER_OPTIONS = {"crf": "20", "preset": "medium", "x264-params": "threads=1:lookahead-threads=1:mbtree=0"}


def _encode(frames: list[np.ndarray], options: dict[str, str]) -> bytes:
    height, width, _ = frames[0].shape
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, FPS)
        stream.codec_context.thread_count = 1
        stream.options = options
        for index, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buffer.getvalue()


@functools.cache
def painted_clip(seed: int, width: int = WIDTH, height: int = HEIGHT) -> bytes:
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    sky = np.array([90, 150, 230], np.float32) * (1 - y) + np.array([250, 200, 170], np.float32) * y
    scene = np.broadcast_to(sky, (height, width, 3)).copy()
    scene[int(height * 0.7) :] = np.array([70, 140, 60], np.float32) + 25 * rng.random((1, width, 1), np.float32)
    brush = rng.normal(0, 6, size=(height // 8 + 1, width // 8 + 1, 3)).astype(np.float32)
    scene += brush.repeat(8, 0).repeat(8, 1)[:height, :width]
    figures = [
        (rng.uniform(0.2, 0.8) * width, rng.uniform(0.3, 0.7) * height, rng.uniform(0.05, 0.2) * height,
         rng.uniform(-6, 6), rng.uniform(-3, 3), rng.integers(0, 255, 3))
        for _ in range(4)
    ]  # fmt: skip
    rows, cols = np.mgrid[0:height, 0:width]
    frames = []
    for index in range(FRAMES):
        image = scene.copy()
        for x, y0, radius, dx, dy, colour in figures:
            image[(cols - x - dx * index) ** 2 + ((rows - y0 - dy * index) * 1.3) ** 2 < radius**2] = colour
        image += rng.normal(0, 2, size=image.shape).astype(np.float32)
        frames.append(np.clip(image, 0, 255).astype(np.uint8))
    return _encode(frames, WORKER_OPTIONS)


def noise_clip(width: int, height: int, seed: int, block: int = 1) -> bytes:
    """Noise in `block`-pixel squares: big for its size, yet not so random that shrinking it is slow."""
    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(FRAMES):
        noise = rng.integers(0, 256, size=(height // block, width // block, 3), dtype=np.uint8)
        frames.append(noise.repeat(block, axis=0).repeat(block, axis=1))
    return _encode(frames, {"crf": "18", "preset": "ultrafast"})


def story_clips(folder: Path, turns: int, distinct: int = 3) -> list[Path]:
    """`turns` clip files in `folder`, copies of `distinct` painted clips: a long story, made in seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    originals = []
    for seed in range(distinct):
        path = folder / f"original_{seed}.mp4"
        path.write_bytes(painted_clip(seed))  # the same bytes each run: made once per process
        originals.append(path)
    paths = []
    for turn in range(turns):
        path = folder / f"job_{turn + 1}.mp4"
        shutil.copyfile(originals[turn % distinct], path)
        paths.append(path)
    return paths
