"""One full-size AnimeGamer turn on one GPU: seconds and peak memory per stage, ours against the release's way.

    python benchmarks/full_turn_gpu.py                    # full size on cuda (random weights at the published sizes)
    python benchmarks/full_turn_gpu.py --model tiny --device cpu   # the same script on a laptop, to check it runs

Ours: bf16 MLLM and decoder, PyTorch SDPA, the CFG pair as one batch, chunked VAE decode, the
state pass in four forwards. The release's choices on the same weights and seed: fp16 decoder
and VAE, both models resident, the state pass as greedy generation with a 200-token budget.
Stages are timed with CUDA events (perf_counter on the CPU) and peak memory is read per stage.
Then (``--characters 2``, the default) Qiqi and Sosuke on one shared base, a turn each, everything
resident and then both parts offloaded, each turn's peak beside the memory plan's figures.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from game.contract import TurnRequest
from game.motion import flow_for
from media.mp4 import encode_mp4
from worker.pipeline.characters import SharedMLLM, random_parts
from worker.pipeline.config import get_config
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.memory import STAGES, Placement, plan
from worker.pipeline.pipeline import AnimeGamerPipeline, _default_dtype
from worker.pipeline.prompt import build_prompt
from worker.pipeline.vae import decode_latents

LINE = "Character: Qiqi; Motion: quickly flying on broomstick; Background: day sky."
RELEASE_STATE_BUDGET = 200


@dataclass
class Stage:
    name: str
    seconds: float
    peak_gib: float


def run_stage(device: torch.device, name: str, fn: Callable[[], Any]) -> tuple[Any, Stage]:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        return out, Stage(name, start.elapsed_time(end) / 1e3, torch.cuda.max_memory_allocated() / 2**30)
    started = time.perf_counter()
    out = fn()
    return out, Stage(name, time.perf_counter() - started, 0.0)


def one_turn(pipe: AnimeGamerPipeline, *, release_state_pass: bool) -> list[Stage]:
    device, cfg = pipe.device, pipe.config
    stages: list[Stage] = []
    prompt, stage = run_stage(device, "prompt", lambda: build_prompt(pipe.tokenizer, LINE, [], cfg.num_query_tokens))
    stages.append(stage)
    embeds = pipe.mllm.embed_prompt(prompt, [])
    if release_state_pass:
        state_fn = lambda: pipe.mllm.release_state_pass(embeds, pipe.tokenizer, RELEASE_STATE_BUDGET)  # noqa: E731
    else:
        state_fn = lambda: pipe.mllm.predict_states(embeds, pipe.tokenizer)  # noqa: E731
    (deltas, passes), stage = run_stage(device, "state pass ({} forwards)", state_fn)
    stage.name = stage.name.format(passes)
    stages.append(stage)
    representation, stage = run_stage(
        device, "representation pass", lambda: pipe.mllm.predict_representation(embeds, prompt)
    )
    stages.append(stage)
    latents, stage = run_stage(
        device,
        f"denoise ({cfg.sampler.num_steps} steps)",
        lambda: pipe.denoise(representation, flow_for(deltas.motion), 0, lambda *a: None),
    )
    stages.append(stage)
    frames, stage = run_stage(
        device, "VAE decode", lambda: decode_latents(pipe.vae, latents.to(pipe.decoder_dtype), cfg.vae.scaling_factor)
    )
    stages.append(stage)
    _, stage = run_stage(device, "MP4 encode", lambda: encode_mp4(frames[0], cfg.fps))
    stages.append(stage)
    return stages


def report(title: str, stages: list[Stage]) -> float:
    total = sum(s.seconds for s in stages)
    print(f"\n{title}")
    print(f"{'stage':<28}{'seconds':>10}{'peak GiB':>10}")
    for s in stages:
        print(f"{s.name:<28}{s.seconds:>10.3f}{s.peak_gib:>10.2f}")
    print(f"{'turn':<28}{total:>10.3f}{max(s.peak_gib for s in stages):>10.2f}")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--characters", type=int, choices=(1, 2), default=2, help="2: also two characters, one base")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("No CUDA GPU is visible: run with --model tiny --device cpu to check the script.")
    torch.backends.cuda.matmul.allow_tf32 = True
    config = get_config(args.model)

    built = time.perf_counter()
    ours = AnimeGamerPipeline.random_weights(config, args.device)
    print(
        f"built {config.name} ({config.num_frames} frames at {config.height}x{config.width}) on {device} "
        f"in {time.perf_counter() - built:.1f} s; random weights"
    )
    one_turn(ours, release_state_pass=False)  # warm-up: kernels, allocator, position tables
    ours_total = report(
        "ours: bf16 MLLM and decoder, state pass in 4 forwards", one_turn(ours, release_state_pass=False)
    )

    # The release's choices on the same modules: fp16 decoder and VAE (cast in place), greedy 200-token states.
    half = torch.float16 if device.type == "cuda" else torch.float32
    ours.decoder.to(half)
    ours.vae.to(half)
    ours.decoder_dtype = half
    one_turn(ours, release_state_pass=True)
    release_total = report(
        "the release's choices: fp16 decoder, greedy state generation (200-token budget)",
        one_turn(ours, release_state_pass=True),
    )
    print(f"\nratio release/ours, whole turn: {release_total / ours_total:.2f}x (one run)")

    if args.characters == 2:
        ours.decoder.to(ours.mllm_dtype)
        ours.vae.to(ours.mllm_dtype)
        ours.decoder_dtype = ours.mllm_dtype
        two_characters(ours)


def two_characters(ours: AnimeGamerPipeline) -> None:
    """Qiqi and Sosuke on one base (random parts, a second random decoder): a turn each, per placement.

    Prints each turn's stages (the pipeline's own timings, with the visits to the GPU) and its peak GPU
    memory beside the memory plan's weights and estimate for that placement.
    """
    cfg, device = ours.config, ours.device
    shared = SharedMLLM(ours.mllm, {"Qiqi": random_parts(ours.mllm, 1), "Sosuke": random_parts(ours.mllm, 2)})
    with device, _default_dtype(ours.decoder_dtype):
        second = AnimeGamerDecoder.from_pipeline_config(cfg.decoder).eval()
    decoders = {"Qiqi": ours.decoder, "Sosuke": second}
    needs = plan(cfg, ours.mllm_dtype, ours.decoder_dtype, characters=2, lora_rank=32)
    print(f"\ntwo characters on one base ({cfg.name}, random weights)")
    print(f"{'placement':<28}{'turn':<8}{'seconds':>9}{'to GPU s':>10}{'peak GiB':>10}{'plan weights':>14}{'plan':>8}")
    for placement in (Placement(), Placement(offload_mllm=True, offload_decoder=True)):
        pipes = {c: replace(ours, decoder=decoders[c], shared=shared, character=c) for c in decoders}
        for pipe in pipes.values():
            pipe.offload_mllm, pipe.offload_decoder = placement.offload_mllm, placement.offload_decoder
        decoder_weights = [p for d in decoders.values() for p in d.parameters()]
        homes = (shared.tensors(), placement.offload_mllm), (decoder_weights, placement.offload_decoder)
        _move_all(homes, device)
        for character in ("Qiqi", "Sosuke", "Qiqi"):
            line = LINE.replace("Qiqi", character)
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            result = pipes[character](TurnRequest(job_id="b", instruction=line, seed=1))
            seconds = time.perf_counter() - started
            peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
            visits = result.timings.get("mllm_to_gpu", 0.0) + result.timings.get("decoder_to_gpu", 0.0)
            weights = max(needs.weights_on_gpu(s, placement) for s in STAGES) / 2**30
            print(
                f"{placement.describe():<28}{character:<8}{seconds:>9.2f}{visits:>10.2f}{peak:>10.2f}"
                f"{weights:>14.2f}{needs.peak(placement) / 2**30:>8.2f}"
            )
        _move_all(homes, device, back=True)


def _move_all(homes, device: torch.device, back: bool = False) -> None:
    """Put offloaded parts in host memory (as the loader would) or back on the device."""
    for tensors, offloaded in homes:
        if offloaded:
            for tensor in tensors:
                tensor.data = tensor.data.to(device if back else "cpu")


if __name__ == "__main__":
    main()
