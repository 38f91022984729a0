"""Where one turn's time goes, for a model on this machine, and what the constrained state pass saves.

    python benchmarks/turn_latency.py [--model tiny] [--turns 5] [--device cpu]

Prints the median time of each stage over --turns turns (after one warm-up turn): prompt build,
state pass, representation pass, each decoder step, VAE decode, MP4 encoding. Then the state
pass both ways on the same prompts: ours (the strength slots only, structural tokens fed with
them through the KV cache) against the release's (greedy generation of up to 200 tokens, one
forward each), as forward passes and seconds, with their ratio from this one run.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import time

import torch

from game.contract import TurnRequest
from worker.pipeline.loading import load_pipeline
from worker.pipeline.prompt import build_prompt

DEMO = [
    "Character: Qiqi; Motion: quickly flying on broomstick; Background: day sky.",
    "Character: Qiqi; Motion: gently sit on railing; Background: day town.",
    "Character: Qiqi; Motion: gently lie down; Background: night bedroom.",
]
RELEASE_BUDGET = 200  # max_new_tokens of the release's state generation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    # The release's way on random weights always fails to parse; one summary line below says so.
    logging.getLogger("worker.pipeline.mllm").setLevel(logging.ERROR)

    started = time.perf_counter()
    pipe = load_pipeline(args.model, device=args.device)
    print(
        f"model {args.model} ({pipe.config.label or 'trained weights'}) on {args.device}, "
        f"loaded in {time.perf_counter() - started:.2f} s, torch threads {torch.get_num_threads()}"
    )
    cfg = pipe.config
    print(f"clip: {cfg.num_frames} frames at {cfg.height}x{cfg.width}, {cfg.sampler.num_steps} denoising steps\n")

    requests = [TurnRequest(job_id=f"b{i}", instruction=DEMO[i % len(DEMO)], seed=i) for i in range(args.turns + 1)]
    stages: dict[str, list[float]] = {}
    step_times: list[float] = []
    for i, request in enumerate(requests):
        marks: list[float] = []
        result = pipe(
            request,
            on_progress=lambda stage, step, total, m=marks: stage == "denoise" and m.append(time.perf_counter()),
        )
        if i == 0:
            continue  # warm-up: first-call allocations and lazy initialisation
        for name, seconds in result.timings.items():
            stages.setdefault(name, []).append(seconds)
        step_times += [b - a for a, b in itertools.pairwise(marks)]

    print(f"{'stage':<22}{'median ms':>12}")
    for name in ("prompt", "state_pass", "representation_pass", "denoise", "vae", "encode"):
        print(f"{name:<22}{statistics.median(stages[name]) * 1e3:>12.2f}")
    print(f"{'  one decoder step':<22}{statistics.median(step_times) * 1e3:>12.2f}   (CFG pair as one batch of 2)")
    total = statistics.median(sum(values) for values in zip(*stages.values(), strict=True))
    print(f"{'turn':<22}{total * 1e3:>12.2f}\n")

    # The state pass both ways, on the same prompts.
    ours_passes, ours_s, release_passes, release_s = [], [], [], []
    for request in requests[1:]:
        prompt = build_prompt(pipe.tokenizer, request.instruction, [], cfg.num_query_tokens)
        embeds = pipe.mllm.embed_prompt(prompt, [])
        t = time.perf_counter()
        _, passes = pipe.mllm.predict_states(embeds, pipe.tokenizer)
        ours_s.append(time.perf_counter() - t)
        ours_passes.append(passes)
        t = time.perf_counter()
        _, passes = pipe.mllm.release_state_pass(embeds, pipe.tokenizer, max_new_tokens=RELEASE_BUDGET)
        release_s.append(time.perf_counter() - t)
        release_passes.append(passes)

    o_p, r_p = statistics.median(ours_passes), statistics.median(release_passes)
    o_s, r_s = statistics.median(ours_s), statistics.median(release_s)
    print("state pass            forward passes   median ms")
    print(f"{'ours (constrained)':<22}{o_p:>14.0f}{o_s * 1e3:>12.2f}")
    print(f"{'release (greedy, 200)':<22}{r_p:>14.0f}{r_s * 1e3:>12.2f}")
    print(f"ratio release/ours: {r_p / o_p:.1f}x forward passes, {r_s / o_s:.1f}x time")
    print(
        "(random weights never emit EOS, so the release's way runs its whole budget; a trained model that\n"
        " stopped right after </ST> would need 12 forwards: the 11 state-block tokens and EOS.)"
    )


if __name__ == "__main__":
    main()
