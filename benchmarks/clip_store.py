"""What keeping clips costs: seconds to write and read one back, and the bytes a day of play leaves in the store.

    python benchmarks/clip_store.py [--clips 8] [--turns-a-day 1000]

Clips are drawn by the toy world's renderer (the scenes the toy model was trained on) at the tiny size (17 x 64 x
96) and at the published one (17 x 480 x 720), plain and half covered by a panning texture, encoded as the worker
encodes a turn's clip. Each is written to and
read back from both homes a clip can have, through the ClipStore the bot uses: the folder (the embedded default)
and an S3 store (a SeaweedFS `weed mini` of its own on 127.0.0.1, as the tests start it). Prints the median
seconds of each, and the bytes 1,000 turns a day keep at the default retention (clips 30 days; the newest 5 of
each character kept longer, not counted), and what the published representations keep in the database, from this
one run. Drawn scenes are flatter than the published model's
frames, so the plain published-size bytes are a floor; the textured ones stand in for a busier painted scene. Neither
is the published model's output (none runs here).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bot.clip_store import ClipStore  # noqa: E402
from media.mp4 import encode_mp4  # noqa: E402
from relay.settings import Settings  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402
from training.toyworld import CLIP, plan_episode, render_clip  # noqa: E402

PUBLISHED = replace(CLIP, height=480, width=720)
REPRESENTATION_BYTES = 226 * 1920 * 2  # a published turn's representation, float16 (ANIMEGAMER.md)


def textured(frames: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The drawn frames half covered by a soft texture that pans 4 pixels a frame: busier, as painted scenes are."""
    t, h, w, _ = frames.shape
    coarse = rng.integers(0, 256, (h // 8 + 1, (w + 4 * t) // 8 + 1, 3), dtype=np.uint8)
    texture = coarse.repeat(8, axis=0).repeat(8, axis=1)[:h].astype(np.float32)
    texture = (texture + np.roll(texture, 4, axis=0) + np.roll(texture, 4, axis=1) + np.roll(texture, 4, (0, 1))) / 4
    panned = np.stack([texture[:, 4 * i : 4 * i + w] for i in range(t)])
    return ((frames.astype(np.float32) + panned) / 2).astype(np.uint8)


def clips(count: int, size, texture: bool = False) -> list[bytes]:
    """``count`` turns of the toy world drawn at ``size``, as MP4."""
    made: list[bytes] = []
    episode = 0
    while len(made) < count:
        rng = np.random.default_rng(episode)
        world, planned = plan_episode(rng, 4)
        for turn in planned:
            frames = render_clip(turn, world, rng, size)
            made.append(encode_mp4(textured(frames, rng) if texture else frames, size.fps))
        episode += 1
    return made[:count]


def timed(store: ClipStore, mp4s: list[bytes], label: str) -> tuple[float, float]:
    """Median seconds to put one clip, and to get it back (checked equal)."""
    writes, reads = [], []
    for i, mp4 in enumerate(mp4s):
        key = f"bench/{label}/{i}.mp4"
        started = time.perf_counter()
        store.put(key, mp4)
        writes.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert store.get(key) == mp4
        reads.append(time.perf_counter() - started)
    return statistics.median(writes), statistics.median(reads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--turns-a-day", type=int, default=1000)
    args = parser.parse_args()
    base = Settings(_env_file=None)
    sizes = {
        "tiny 17x64x96": clips(args.clips, CLIP),
        "published 17x480x720": clips(args.clips, PUBLISHED),
        "published, textured": clips(args.clips, PUBLISHED, texture=True),
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = S3Server(Path(tmp) / "seaweedfs")
        server.start()
        try:
            homes = {
                "folder": ClipStore.of(base.model_copy(update={"clip_dir": Path(tmp) / "clips"})),
                "s3 (SeaweedFS)": ClipStore.of(server.settings(base)),
            }
            print(f"{'clip':<22} {'bytes':>9} {'store':<16} {'write s':>8} {'read s':>8}")
            for label, mp4s in sizes.items():
                median_bytes = statistics.median(len(m) for m in mp4s)
                for home, store in homes.items():
                    timed(store, mp4s[:1], f"warm-{label}")  # the first call opens the connection
                    write, read = timed(store, mp4s, label)
                    print(f"{label:<22} {median_bytes:>9,.0f} {home:<16} {write:>8.4f} {read:>8.4f}")
        finally:
            server.stop()
    days = base.clip_retention_days
    print(f"\n{args.turns_a_day:,} turns a day, clips kept {days} days (ANIMEGAMER_CLIP_RETENTION_DAYS):")
    for label, mp4s in sizes.items():
        daily = args.turns_a_day * statistics.median(len(m) for m in mp4s)
        print(f"  {label:<22} {daily / 1e6:>8.1f} MB a day, {daily * days / 1e9:>7.2f} GB held once retention turns")
    kept = base.representation_retention_days
    daily = args.turns_a_day * REPRESENTATION_BYTES
    print(f"and in the database, representations kept {kept} days (ANIMEGAMER_REPRESENTATION_RETENTION_DAYS):")
    print(f"  {'226 x 1920 float16':<22} {daily / 1e6:>8.1f} MB a day, {daily * kept / 1e9:>7.2f} GB held")


if __name__ == "__main__":
    main()
