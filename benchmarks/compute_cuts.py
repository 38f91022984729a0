"""Each compute cut's clip against the full-compute clip of the same seed, and what it saves, on this CPU.

    python benchmarks/compute_cuts.py                 # the toy model (trained; no guidance), 12 turns
    python benchmarks/compute_cuts.py --model tiny    # the tiny model (random weights, the release's guidance)
    python benchmarks/compute_cuts.py --turns 4       # quicker

Every turn is played first as today's code played it before these cuts (3D convolutions in the VAE, every
decoder block at every step, 50 steps, both halves of the CFG pair) and then with each cut, from the same seed
and instruction. Per cut: the worst frame's PSNR and SSIM against the full-compute clip over all turns (a cut is
kept on by default only at 35 dB or more), judged on the frames before the MP4 encoder (H.264 answers a change of
one level on a few pixels with other encoding decisions across the frame: 33 dB after encoding where the frames
were 91 dB apart); the decoder steps the step cache reused; and the median seconds of a turn in this process,
encoding included, with its ratio to today's. The toy model has no guidance, so the unconditional-half cut is
measured on the tiny model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from game.contract import TurnRequest  # noqa: E402
from media.mp4 import encode_mp4  # noqa: E402
from training.metrics import frame_psnr, frame_ssim  # noqa: E402
from worker.pipeline.loading import load_pipeline  # noqa: E402
from worker.pipeline.pipeline import AnimeGamerPipeline  # noqa: E402
from worker.pipeline.vae import conv3d_by_frames  # noqa: E402

LINES = [
    f"Character: Qiqi; Motion: {motion}; Background: {background}."
    for motion, background in (
        ("quickly fly on broomstick", "night sky"),
        ("slowly walk", "town"),
        ("jump", "day sky"),
        ("gently wave", "forest"),
        ("quickly run", "beach"),
        ("sit down", "room"),
    )
]


@dataclass
class Cut:
    name: str
    sampler: dict[str, float | int] = field(default_factory=dict)
    vae_by_frames: bool = True


def cuts_for(model: str) -> list[Cut]:
    made = [Cut("the VAE's 3D convolutions as 2D ones (on by default on the CPU)")]
    if model == "tiny":  # guidance: the unconditional-half cut applies
        made += [
            Cut(f"+ skip the unconditional half, w - 1 <= {t:g}", {"skip_unconditional_below": t}) for t in (1e-3, 1e-2)
        ]
    made += [Cut(f"+ step cache, change < {t:g}", {"step_cache_below": t}) for t in (0.1, 0.15, 0.2, 0.25)]
    made += [Cut(f"+ {n} steps", {"num_steps": n}) for n in (30, 20)]
    return made


def play(pipe: AnimeGamerPipeline, line: str, seed: int) -> tuple[np.ndarray, float, int]:
    """The turn's frames before the MP4 encoder, its seconds in this process (the encoding included) and the
    denoising steps the step cache answered."""
    started = time.perf_counter()
    clip = pipe.render(TurnRequest(job_id="cut", instruction=line, seed=seed))
    encode_mp4(clip.frames, pipe.config.fps)
    return clip.frames, time.perf_counter() - started, pipe.steps_reused


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy", choices=("toy", "tiny"))
    parser.add_argument("--turns", type=int, default=12)
    args = parser.parse_args(argv)

    pipe = load_pipeline(args.model, "cpu")
    own = pipe.config
    today_sampler = replace(own.sampler, step_cache_below=0.0, skip_unconditional_below=0.0)
    today = Cut("today", vae_by_frames=False)
    turns = [(LINES[i % len(LINES)], i) for i in range(args.turns)]

    def use(cut: Cut) -> None:
        for module in pipe.vae.modules():  # the class's own Conv3d._conv_forward again, unless the cut says
            module.__dict__.pop("_conv_forward", None)
        if cut.vae_by_frames:
            conv3d_by_frames(pipe.vae)
        pipe.config = replace(own, sampler=replace(today_sampler, **cut.sampler))

    def played(cut: Cut, line: str, seed: int) -> tuple[np.ndarray, float, int]:
        use(cut)
        return play(pipe, line, seed)

    played(today, *turns[0])  # warm up: first-call allocations and thread pools
    reference, today_seconds, _ = zip(*(played(today, line, seed) for line, seed in turns), strict=True)
    print(
        f"{args.model} model, {len(turns)} turns, {own.num_frames} frames at {own.height}x{own.width}; today: "
        f"{statistics.median(today_seconds):.2f} s a turn (median, in process), torch threads "
        f"{torch.get_num_threads()}; each cut's turn timed right after today's same turn, the ratio their median\n"
    )
    print("| cut | worst PSNR (dB) | worst SSIM | steps reused | s a turn | today / this |")
    print("|---|---|---|---|---|---|")
    for cut in cuts_for(args.model):
        clips, seconds, reused, ratios = [], [], [], []
        for line, seed in turns:  # today's turn beside each cut's: a busy machine slows both alike
            _, before, _ = played(today, line, seed)
            clip, after, steps_reused = played(cut, line, seed)
            clips.append(clip)
            seconds.append(after)
            reused.append(steps_reused)
            ratios.append(before / after)
        psnr = min(min(frame_psnr(clip, ref)) for clip, ref in zip(clips, reference, strict=True))
        ssim = min(min(frame_ssim(clip, ref)) for clip, ref in zip(clips, reference, strict=True))
        steps = len(turns) * pipe.config.sampler.num_steps
        print(
            f"| {cut.name} | {psnr:.2f} | {ssim:.4f} | {sum(reused)} of {steps} | {statistics.median(seconds):.2f} "
            f"| {statistics.median(ratios):.2f} |"
        )


if __name__ == "__main__":
    main()
