"""Whether a turn's representation may travel and be stored as float16: the clips it decodes to, both ways.

    python benchmarks/representation_precision.py [--model toy] [--turns 8] [--device cpu] [--threads N]

For each demo instruction the MLLM predicts the turn's representation once (float32 on the CPU); the decoder then
denoises the same seed's noise conditioned on that representation as float32 and as float16 (what the worker writes
and the bot stores), and the VAE decodes both. Printed per turn and overall: the pixel difference of the two clips
(max abs and mean abs over uint8 frames, PSNR), and, as its scale, the mean abs difference between the same turn
made with two seeds (what a reroll changes). The same comparison is made for the next turn, whose prompt carries
this turn as history in either precision (window 2). The ratio printed last is the float16 change over the reroll
change, from this one run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from game.contract import HistoryTurn  # noqa: E402
from game.motion import flow_for  # noqa: E402
from game.state import StateDeltas  # noqa: E402
from worker.pipeline.loading import load_pipeline  # noqa: E402
from worker.pipeline.pipeline import AnimeGamerPipeline  # noqa: E402
from worker.pipeline.prompt import build_prompt  # noqa: E402
from worker.pipeline.vae import decode_latents  # noqa: E402

DEMO = (REPO / "game" / "data" / "demo.txt").read_text().splitlines()


@torch.no_grad()
def make_turn(
    pipe: AnimeGamerPipeline, instruction: str, seed: int, history: list[tuple[HistoryTurn, torch.Tensor]]
) -> tuple[torch.Tensor, StateDeltas]:
    """The MLLM's two passes, as the pipeline runs them: the representation (1, 226, D) and the state deltas."""
    prompt = build_prompt(pipe.tokenizer, instruction, [turn for turn, _ in history], pipe.config.num_query_tokens)
    embeds = pipe.mllm.embed_prompt(prompt, [rep for _, rep in history])
    deltas, _ = pipe.mllm.predict_states(embeds, pipe.tokenizer)
    return pipe.mllm.predict_representation(embeds, prompt).float(), deltas


@torch.no_grad()
def clip_for(pipe: AnimeGamerPipeline, representation: torch.Tensor, deltas: StateDeltas, seed: int) -> np.ndarray:
    """The decoder and the VAE, as the pipeline runs them: uint8 frames (T, H, W, 3)."""
    latents = pipe.denoise(representation, flow_for(deltas.motion), seed, lambda stage, step, total: None)
    return decode_latents(pipe.vae, latents.to(pipe.decoder_dtype), pipe.config.vae.scaling_factor)[0]


def difference(a: np.ndarray, b: np.ndarray) -> tuple[int, float, float]:
    """Max abs, mean abs and PSNR (dB, 255 peak; inf when identical) of two uint8 clips."""
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    mse = float((diff.astype(np.float64) ** 2).mean())
    psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
    return int(diff.max()), float(diff.mean()), psnr


def half(representation: torch.Tensor) -> torch.Tensor:
    """What a stored float16 representation reads back as."""
    return representation.to(torch.float16).float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="toy", help="toy (trained, the default) or tiny (random weights)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    started = time.perf_counter()
    pipe = load_pipeline(args.model, device=args.device)
    cfg = pipe.config
    print(
        f"model {args.model} ({cfg.label or 'trained weights'}) on {args.device}, loaded in "
        f"{time.perf_counter() - started:.1f} s; representation {cfg.num_query_tokens} x {cfg.decoder.hidden_size}, "
        f"decoder in {pipe.decoder_dtype}, {cfg.sampler.num_steps} steps\n"
    )
    rows: dict[str, list[tuple[int, float, float]]] = {"this turn": [], "next turn (history)": []}
    reroll: list[float] = []
    rep_error: list[float] = []
    print(f"{'turn':>4}  {'which':<20} {'max abs':>7} {'mean abs':>9} {'PSNR dB':>8}")
    for i in range(args.turns):
        instruction, following, seed = DEMO[i % len(DEMO)], DEMO[(i + 1) % len(DEMO)], 1000 + i
        rep, deltas = make_turn(pipe, instruction, seed, [])
        rep_error.append(float((half(rep) - rep).abs().max() / rep.abs().max()))
        full, halved = clip_for(pipe, rep, deltas, seed), clip_for(pipe, half(rep), deltas, seed)
        reroll.append(difference(full, clip_for(pipe, rep, deltas, seed + 7919))[1])
        rows["this turn"].append(difference(full, halved))

        past = HistoryTurn(instruction=instruction, representation=b"", deltas=deltas)
        next_full, next_deltas = make_turn(pipe, following, seed + 1, [(past, rep[0])])
        next_halved, halved_deltas = make_turn(pipe, following, seed + 1, [(past, half(rep)[0])])
        rows["next turn (history)"].append(
            difference(
                clip_for(pipe, next_full, next_deltas, seed + 1), clip_for(pipe, next_halved, halved_deltas, seed + 1)
            )
        )
        for which, values in rows.items():
            m, mean, psnr = values[-1]
            print(f"{i + 1:>4}  {which:<20} {m:>7} {mean:>9.4f} {psnr:>8.1f}")
        print(f"{'':>4}  {'reroll (2 seeds)':<20} {'':>7} {reroll[-1]:>9.4f}")

    print(f"\nfloat16 representation: largest element error {max(rep_error):.2e} of the largest |value|")
    for which, values in rows.items():
        finite = [p for _, _, p in values if math.isfinite(p)]
        worst = f"PSNR min {min(finite):.1f} dB" if finite else "PSNR inf"
        identical = sum(not math.isfinite(p) for _, _, p in values)
        largest, mean = max(m for m, _, _ in values), statistics.mean(v for _, v, _ in values)
        print(f"{which}: max abs {largest}, mean abs {mean:.4f}, {worst}, {identical} of {len(values)} clips identical")
    ratio = statistics.mean(v for _, v, _ in rows["this turn"]) / statistics.mean(reroll)
    print(f"mean abs change float16 / reroll: {ratio:.2e}")


if __name__ == "__main__":
    main()
