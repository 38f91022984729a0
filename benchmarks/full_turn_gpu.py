"""One full-size AnimeGamer turn on one GPU: seconds and peak memory per stage, ours against the release's way.

    python benchmarks/full_turn_gpu.py                    # full size on cuda (random weights at the published sizes)
    python benchmarks/full_turn_gpu.py --model tiny --device cpu   # the same script on a laptop, to check it runs

Ours: bf16 MLLM and decoder, PyTorch SDPA, the CFG pair as one batch, chunked VAE decode, the
state pass in four forwards. The release's choices on the same weights and seed: fp16 decoder
and VAE, both models resident, the state pass as greedy generation with a 200-token budget.
Stages are timed with CUDA events (perf_counter on the CPU) and peak memory is read per stage.
Then every compute cut on and off (``cuts``): the denoising loop with the unconditional half skipped where the
guidance weight is within 0.001 of 1, with the step cache, with 30 and 20 steps, with the decoder's blocks
compiled (``torch.compile``) and with each of PyTorch's fused attention kernels forced, and the VAE decode tiled:
seconds, peak memory, and the FLOP/s achieved against the H200's dense bf16 peak (benchmarks/turn_flops.py
counts the FLOPs on the meta device). Then (``--characters 2``, the default) Qiqi and Sosuke on one shared base,
a turn each, everything resident and then both parts offloaded, each turn's peak beside the memory plan's figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from game.contract import TurnRequest
from game.motion import flow_for
from media.mp4 import encode_mp4
from training.metrics import frame_psnr
from worker.pipeline.characters import SharedMLLM, random_parts
from worker.pipeline.config import get_config
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.memory import STAGES, Placement, plan
from worker.pipeline.pipeline import AnimeGamerPipeline, _default_dtype
from worker.pipeline.prompt import build_prompt
from worker.pipeline.vae import decode_latents

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.turn_flops, when run as a script
from benchmarks.turn_flops import H200_BF16_DENSE, RELEASE_STATE_BUDGET, count

LINE = "Character: Qiqi; Motion: quickly flying on broomstick; Background: day sky."


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--characters", type=int, choices=(1, 2), default=2, help="2: also two characters, one base")
    parser.add_argument("--compile", action="store_true", help="time torch.compile off a GPU too (minutes to build)")
    args = parser.parse_args(argv)
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

    ours.decoder.to(ours.mllm_dtype)
    ours.vae.to(ours.mllm_dtype)
    ours.decoder_dtype = ours.mllm_dtype
    cuts(ours, compile_blocks=args.compile or device.type == "cuda")
    if args.characters == 2:
        two_characters(ours)


SAMPLER_CUTS: dict[str, dict[str, float | int]] = {
    "every step, both halves (as released)": {},
    "skip the unconditional half, w - 1 <= 0.001": {"skip_unconditional_below": 1e-3},
    "step cache, change < 0.2": {"step_cache_below": 0.2},
    "30 steps": {"num_steps": 30},
    "20 steps": {"num_steps": 20},
}


def cuts(pipe: AnimeGamerPipeline, compile_blocks: bool) -> None:
    """The denoising loop and the VAE decode under each cut, from one representation and one seed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device, base = pipe.device, pipe.config
    counted = count(base)  # on the meta device: the FLOPs of each forward at these sizes
    prompt = build_prompt(pipe.tokenizer, LINE, [], base.num_query_tokens)
    embeds = pipe.mllm.embed_prompt(prompt, [])
    representation = pipe.mllm.predict_representation(embeds, prompt)
    flow = flow_for(3)

    def denoise() -> torch.Tensor:
        return pipe.denoise(representation, flow, 0, lambda *a: None)

    print(f"\ncompute cuts ({base.name}, on {device}; FLOP/s against the H200's {H200_BF16_DENSE / 1e12:.0f} TFLOP/s)")
    print(f"{'denoising loop':<48}{'seconds':>9}{'peak GiB':>10}{'reused':>8}{'TFLOP/s':>9}{'of H200':>9}")

    def row(name: str, sampler: object) -> torch.Tensor:
        latents, stage = run_stage(device, name, denoise)
        flops = counted.turn(sampler).flops("denoise")
        reused = pipe.steps_reused  # a reused step runs the first block only: its FLOPs are not all made
        rate = "" if reused else f"{flops / stage.seconds / 1e12:>9.3g}{flops / stage.seconds / H200_BF16_DENSE:>9.1%}"
        print(f"{name:<48}{stage.seconds:>9.2f}{stage.peak_gib:>10.2f}{reused:>8}{rate}")
        return latents

    full_latents = None
    for name, changes in SAMPLER_CUTS.items():
        pipe.config = replace(base, sampler=replace(base.sampler, **changes))
        denoise()  # warm-up at this step count
        latents = row(name, pipe.config.sampler)
        full_latents = latents if full_latents is None else full_latents
    pipe.config = base
    backends = (
        ("flash attention", SDPBackend.FLASH_ATTENTION),
        ("memory-efficient attention", SDPBackend.EFFICIENT_ATTENTION),
    )
    for name, backend in backends:
        try:
            with sdpa_kernel([backend]):
                denoise()  # warm-up with this kernel
                row(f"{name} forced", base.sampler)
        except RuntimeError as exc:  # this device or dtype has no such kernel
            print(f"{name + ' forced':<48}unavailable: {str(exc).splitlines()[0][:60]}")
    if compile_blocks:
        eager = list(pipe.decoder.transformer_blocks)
        pipe.decoder.transformer_blocks = torch.nn.ModuleList(torch.compile(block) for block in eager)
        denoise()  # compiles
        row("decoder blocks compiled (torch.compile)", base.sampler)
        pipe.decoder.transformer_blocks = torch.nn.ModuleList(eager)

    print(f"\n{'VAE decode':<48}{'seconds':>9}{'peak GiB':>10}{'TFLOP/s':>9}{'worst PSNR':>12}")
    assert full_latents is not None
    z = full_latents.to(pipe.decoder_dtype)
    whole = None
    for name, tiled in (("whole frames (as released)", False), ("tiled (diffusers' enable_tiling)", True)):
        pipe.vae.enable_tiling() if tiled else pipe.vae.disable_tiling()
        frames, stage = run_stage(device, name, lambda: decode_latents(pipe.vae, z, base.vae.scaling_factor))
        whole = frames[0] if whole is None else whole
        psnr = min(frame_psnr(frames[0], whole))
        rate = "-" if tiled else f"{counted.vae.flops / stage.seconds / 1e12:.3g}"  # tiles overlap: more work
        print(f"{name:<48}{stage.seconds:>9.2f}{stage.peak_gib:>10.2f}{rate:>9}{psnr:>12.1f}")
    pipe.vae.disable_tiling()


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
