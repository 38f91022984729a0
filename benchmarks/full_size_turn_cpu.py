"""One turn of the published model at its full size on this CPU: the published shapes and dtypes on a real processor.

    python benchmarks/full_size_turn_cpu.py                # full size: an 18 GB tree, about 20 GB of memory
    python benchmarks/full_size_turn_cpu.py --size tiny    # the same script in seconds, to check it runs

Writes the tree benchmarks/full_size_load.py writes (random bf16 weights at the published sizes in the release's
layout, ``tests/checkpoints/release_random.py``), or reuses the one a run finished there; loads Qiqi through the
real loader (``load_release_pipelines``) in bf16 on the CPU with ``--steps`` denoising steps (2), and plays one
turn at 480x720 stage by stage, as ``AnimeGamerPipeline.__call__`` does, with one difference: each model is let go
once its stages are done (the MLLM before denoising, the decoder before the VAE decode). The pipeline's own call
holds all three to the end, 18 GB of weights beside the VAE's activations, more than this 24 GB machine has; a
worker does not need to, since it runs on a GPU, but this run is about the arithmetic and the VAE's memory.

Prints seconds per stage, the peak resident memory of each stage (``VmHWM``, reset before each where the kernel
allows), and the clip's frame count and size, and writes the MP4 under ``--out``. Skips, saying why, when the disk
or the memory has too little free.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.full_size_load import DEFAULT_ROOT, GIB, mem_available, prepare_tree, status  # noqa: E402

LINE = "Character: Qiqi; Motion: quickly fly on broomstick; Background: day sky."
MEMORY_MARGIN = 4 * GIB  # the VAE's activations at 480x720 and the interpreter, beyond the weights


def reset_peak() -> None:
    """Start VmHWM again from the current resident size (Linux's clear_refs 5), so each stage shows its own peak."""
    with contextlib.suppress(OSError):  # then each figure is the peak so far
        Path("/proc/self/clear_refs").write_text("5")


def stage(rows: list[tuple[str, float, int]], name: str, fn: Callable[[], Any]) -> Any:
    reset_peak()
    started = time.perf_counter()
    out = fn()
    rows.append((name, time.perf_counter() - started, status()["VmHWM"]))
    print(f"  {name}: {rows[-1][1]:.1f} s, peak {rows[-1][2] / GIB:.2f} GiB", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="where the tree is written (reused)")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--steps", type=int, default=2, help="denoising steps (the published model takes 50)")
    parser.add_argument("--out", type=Path, default=ROOT / "out", help="where the clip is written")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="the weights' and the VAE's dtype: the release's bf16, or float32 (a CPU without bf16 units computes "
        "bf16 convolutions many times slower: the tiny tree's 480x720 VAE decode took 85 s here in bf16, 19 s in "
        "float32)",
    )
    args = parser.parse_args(argv)

    import torch

    dtype = getattr(torch, args.dtype)

    from game.contract import TurnRequest
    from game.motion import flow_for
    from media.mp4 import decode_mp4, encode_mp4
    from tests.checkpoints.release_random import plan_tree, tiny_plan
    from worker.pipeline.checkpoints.load import load_release_pipelines
    from worker.pipeline.config import full, tiny
    from worker.pipeline.prompt import build_prompt
    from worker.pipeline.vae import decode_latents

    characters = ("Qiqi",)
    plan = plan_tree(full(), characters) if args.size == "full" else tiny_plan(tiny(), characters)
    if mem_available() < plan.total_bytes + MEMORY_MARGIN:
        print(
            f"SKIPPED: the weights need {plan.total_bytes / GIB:.1f} GiB and the turn about "
            f"{MEMORY_MARGIN / GIB:.0f} GiB more; this machine has {mem_available() / GIB:.1f} GiB available"
        )
        return
    if not prepare_tree(args.root, plan, characters):
        return

    rows: list[tuple[str, float, int]] = []
    print(f"one {args.size}-size turn on the CPU, {torch.get_num_threads()} threads, {args.steps} steps:", flush=True)
    load = lambda: load_release_pipelines(  # noqa: E731
        args.root, characters, device="cpu", dtype=dtype, num_steps=args.steps
    )
    pipe = stage(rows, f"load (the real loader, {args.dtype})", load)["Qiqi"]
    cfg = pipe.config
    request = TurnRequest(job_id="full-size-cpu", instruction=LINE, seed=0)
    with torch.no_grad():
        prompt = build_prompt(pipe.tokenizer, request.instruction, [], cfg.num_query_tokens)
        embeds = stage(rows, f"embed the prompt ({len(prompt.ids)} tokens)", lambda: pipe.mllm.embed_prompt(prompt, []))
        deltas, _ = stage(rows, "state pass (4 forwards)", lambda: pipe.mllm.predict_states(embeds, pipe.tokenizer))
        representation = stage(
            rows, "representation pass", lambda: pipe.mllm.predict_representation(embeds, prompt)
        )  # (1, 226, 1920)
        pipe.mllm = pipe.shared = None  # let go of the MLLM: denoising and the VAE do not read it
        gc.collect()
        flow = flow_for(deltas.motion)
        latents = stage(
            rows,
            f"denoise ({args.steps} steps, {cfg.latent_frames}x{cfg.latent_height}x{cfg.latent_width} latents)",
            lambda: pipe.denoise(representation, flow, request.seed, lambda *_: None),
        )  # (1, F, C, h, w)
        pipe.decoder = None
        gc.collect()
        frames = stage(rows, "VAE decode", lambda: decode_latents(pipe.vae, latents.to(dtype), cfg.vae.scaling_factor))[
            0
        ]  # (T, H, W, 3)
    mp4 = stage(rows, "MP4 encode", lambda: encode_mp4(frames, cfg.fps))
    args.out.mkdir(parents=True, exist_ok=True)
    clip = args.out / f"full_size_turn_cpu_{args.size}.mp4"
    clip.write_bytes(mp4)
    decoded = decode_mp4(mp4)

    print("\n| stage | seconds | peak resident GiB |")
    print("|---|---|---|")
    for name, seconds, peak in rows:
        print(f"| {name} | {seconds:.1f} | {peak / GIB:.2f} |")
    turn = sum(seconds for name, seconds, _ in rows if not name.startswith("load"))
    print(
        f"\nturn {turn:.0f} s after the load; clip {clip}: {decoded.shape[0]} frames of {decoded.shape[2]}x"
        f"{decoded.shape[1]}, {len(mp4):,} bytes; states {deltas}; process peak {max(r[2] for r in rows) / GIB:.2f} GiB"
    )


if __name__ == "__main__":
    main()
