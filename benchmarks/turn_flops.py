"""The work of one AnimeGamer turn at the published sizes, counted: FLOPs per stage, ours against the release's.

    python benchmarks/turn_flops.py                  # the published sizes, on the meta device (no weights, seconds)
    python benchmarks/turn_flops.py --history 4      # a prompt holding the longest history (4 past turns)
    python benchmarks/turn_flops.py --model tiny     # the same count at the tiny sizes

Every forward a turn makes is run once on the ``meta`` device under ``torch.utils.flop_counter.FlopCounterMode``
through the pipeline's own modules (the MLLM's prompt and cached forwards, the representation pass, one decoder
forward at batch 1 and at batch 2, the VAE decode), so what is counted is the code that runs, at the published
shapes. A turn is then composed from those forwards by each way's choices:

- the release: the state pass as greedy generation, one forward per token, to its 200-token budget
  (``RELEASE_STATE_BUDGET``, what its ``generate`` allows; a trained model may stop sooner at EOS), and both halves
  of the CFG pair at every one of 50 steps;
- ours: the state pass in four forwards (worker/pipeline/mllm.py, ``state_logits``), and each sampler cut as a
  ``SamplerConfig`` (skipping the unconditional half where the guidance weight is within a tolerance of 1, fewer
  steps); which steps skip is asked of the sampler itself (``skips_unconditional``).

The count is of matrix products, convolutions and attention (what FlopCounterMode counts; element-wise work is
left out, a few percent at these sizes). What an H200 needs for it: each forward takes at least the longer of its
FLOPs at the GPU's dense bf16 peak and the time to read its weights once at the GPU's memory bandwidth (a
roofline: the MLLM's one-token forwards are bound by the second, everything else by the first). The prompt's text
is counted in the project's byte tokens, more than Mistral's tokenizer makes, so the MLLM figures are an upper
bound; they are a few percent of a turn either way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from game.contract import HistoryTurn  # noqa: E402
from game.state import StateDeltas  # noqa: E402
from worker.pipeline.config import PipelineConfig, SamplerConfig, get_config  # noqa: E402
from worker.pipeline.mllm import STATE_TAGS, state_step_tokens  # noqa: E402
from worker.pipeline.pipeline import AnimeGamerPipeline  # noqa: E402
from worker.pipeline.prompt import Prompt, build_prompt  # noqa: E402
from worker.pipeline.sampler import DPMSolverSDESampler  # noqa: E402

LINE = "Character: Qiqi; Motion: quickly flying on broomstick; Background: day sky."
RELEASE_STATE_BUDGET = 200  # the release's generate budget; benchmarks/full_turn_gpu.py times its state pass with it

# NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): BF16 Tensor Core 1,979 TFLOPS "with
# sparsity", so 989.5 TFLOPS dense; GPU memory bandwidth 4.8 TB/s. The same dense figure as the H100 SXM.
H200_BF16_DENSE = 989.5e12  # FLOP/s
H200_BANDWIDTH = 4.8e12  # bytes/s
SUSTAINED = 0.4  # a stated fraction of the peak that large transformer forwards sustain in practice (MFU)


@dataclass(frozen=True)
class Forward:
    """One kind of forward pass: its FLOPs and the bytes of weights it reads (bf16)."""

    flops: int
    weight_bytes: int

    def seconds(self, peak: float = H200_BF16_DENSE, bandwidth: float = H200_BANDWIDTH) -> float:
        """Its floor on the GPU: compute at ``peak`` or reading the weights at ``bandwidth``, whichever is longer."""
        return max(self.flops / peak, self.weight_bytes / bandwidth)


@dataclass(frozen=True)
class TurnWork:
    """Each stage of one turn as (forward, how many times): what a way of playing a turn runs."""

    stages: dict[str, list[tuple[Forward, int]]]

    def flops(self, stage: str | None = None) -> int:
        names = [stage] if stage else list(self.stages)
        return sum(forward.flops * times for name in names for forward, times in self.stages[name])

    def seconds(self, peak: float = H200_BF16_DENSE, bandwidth: float = H200_BANDWIDTH) -> float:
        return sum(f.seconds(peak, bandwidth) * times for parts in self.stages.values() for f, times in parts)


def _cpu_attention_flops(query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
    return sdpa_flop_count(query, key, value)


# PyTorch's counter knows the GPU's fused attention kernels and counts the meta device's (unfused) attention as
# matrix products, but not the CPU's fused kernel: counted here by the same formula, so a run on a real CPU counts
# what one on meta does.
CPU_ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}


def counted(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn`` under the FLOP counter: its result and the FLOPs it made."""
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        result = fn(*args, **kwargs)
    return result, counter.get_total_flops()


def weight_bytes(module: torch.nn.Module, bytes_per_weight: int = 2) -> int:
    return sum(p.numel() for p in module.parameters()) * bytes_per_weight


def meta_pipeline(config: PipelineConfig) -> AnimeGamerPipeline:
    """The pipeline's modules at ``config``'s sizes with no storage: shapes and dtypes only, built in seconds."""
    return AnimeGamerPipeline.random_weights(config, "meta", mllm_dtype=torch.bfloat16, decoder_dtype=torch.bfloat16)


def turn_prompt(pipe: AnimeGamerPipeline, past_turns: int) -> tuple[Prompt, torch.Tensor]:
    """The prompt of a turn with ``past_turns`` before it, and its embeddings (history spans resampled)."""
    zero = StateDeltas(motion=0, social=0, entertainment=0, stamina=0)
    history = [HistoryTurn(instruction=LINE, representation=b"", deltas=zero) for _ in range(past_turns)]
    prompt = build_prompt(pipe.tokenizer, LINE, history, pipe.config.num_query_tokens)
    shape = (pipe.config.num_query_tokens, pipe.config.decoder.hidden_size)
    representations = [torch.zeros(shape, device=pipe.device, dtype=pipe.mllm_dtype) for _ in history]
    return prompt, pipe.mllm.embed_prompt(prompt, representations)


def state_pass_forwards(pipe: AnimeGamerPipeline, embeds: torch.Tensor, steps: list[int]) -> list[Forward]:
    """The forwards of a state pass: the prompt's (keeping one position's logits), then one per entry of
    ``steps`` feeding that many tokens through the KV cache, as ``state_logits`` and ``release_generate`` do."""
    llm, weights = pipe.mllm.llm, weight_bytes(pipe.mllm.llm)
    cache = DynamicCache(config=llm.config)
    out, flops = counted(llm, inputs_embeds=embeds, cache=cache, use_cache=True, logits_to_keep=1)
    forwards = [Forward(flops, weights)]
    for tokens in steps:
        ids = torch.zeros((1, tokens), dtype=torch.long, device=pipe.device)
        out, flops = counted(llm, input_ids=ids, cache=out.cache, use_cache=True, logits_to_keep=1)
        forwards.append(Forward(flops, weights))
    return forwards


def ours_state_steps() -> list[int]:
    """Our state pass after the prompt's forward: each chosen Strength fed with the two tags that follow it."""
    return [state_step_tokens(slot) for slot in range(len(STATE_TAGS) - 1)]


def denoise_forwards(pipe: AnimeGamerPipeline) -> tuple[Forward, Forward, Forward]:
    """The unconditional tokens (made once a turn), one decoder forward with the conditional half alone (batch 1)
    and one with the CFG pair (batch 2)."""
    cfg, decoder = pipe.config, pipe.decoder
    shape = (cfg.latent_frames, cfg.decoder.latent_channels, cfg.latent_height, cfg.latent_width)
    _, flops = counted(decoder.unconditional_tokens, 1)
    made = [Forward(flops, 0)]  # the projections' weights are read by the forwards anyway
    for batch in (1, 2):
        latents = torch.zeros((batch, *shape), device=pipe.device, dtype=pipe.decoder_dtype)
        condition = decoder.unconditional_tokens(batch)  # (B, 226, D): the representation's shape
        timestep = torch.zeros((batch,), device=pipe.device)
        _, flops = counted(decoder, latents, timestep, condition, timestep)
        made.append(Forward(flops, weight_bytes(decoder)))
    return made[0], made[1], made[2]


def vae_forward(pipe: AnimeGamerPipeline) -> Forward:
    """The VAE's decode of one clip's latents, as ``decode_latents`` runs it."""
    cfg = pipe.config
    z = torch.zeros(
        (1, cfg.vae.latent_channels, cfg.latent_frames, cfg.latent_height, cfg.latent_width),
        device=pipe.device,
        dtype=pipe.decoder_dtype,
    )
    _, flops = counted(lambda: pipe.vae.decode(z).sample)
    return Forward(flops, weight_bytes(pipe.vae.decoder))


def denoise_work(
    sampler: SamplerConfig, unconditional: Forward, single: Forward, pair: Forward
) -> list[tuple[Forward, int]]:
    """The denoising loop under ``sampler``: how many steps run the conditional half alone, how many the pair."""
    run = DPMSolverSDESampler(sampler)
    alone = sum(run.skips_unconditional(i) for i in range(sampler.num_steps))
    return [(unconditional, 1), (single, alone), (pair, sampler.num_steps - alone)]


@dataclass(frozen=True)
class Counted:
    """Every forward a turn is made of, counted once."""

    state_ours: list[Forward]
    state_release: list[Forward]
    representation: Forward
    unconditional: Forward
    single: Forward
    pair: Forward
    vae: Forward

    def turn(self, sampler: SamplerConfig, release: bool = False) -> TurnWork:
        """A turn under ``sampler`` as this code plays it, or (``release``) as the release does: its generated
        state pass and the CFG pair at every step, where this code runs the conditional half alone at the steps
        whose weight is exactly 1 even with the skip set to 0."""
        state = self.state_release if release else self.state_ours
        steps = sampler.num_steps
        loop = [(self.unconditional, 1), (self.pair, steps)] if release else None
        return TurnWork(
            {
                "state pass": [(forward, 1) for forward in state],
                "representation pass": [(self.representation, 1)],
                "denoise": loop or denoise_work(sampler, self.unconditional, self.single, self.pair),
                "vae decode": [(self.vae, 1)],
            }
        )


def count(config: PipelineConfig, past_turns: int = 0, release_budget: int = RELEASE_STATE_BUDGET) -> Counted:
    pipe = meta_pipeline(config)
    with torch.no_grad():
        prompt, embeds = turn_prompt(pipe, past_turns)
        state_ours = state_pass_forwards(pipe, embeds, ours_state_steps())
        state_release = state_pass_forwards(pipe, embeds, [1] * (release_budget - 1))
        _, flops = counted(pipe.mllm.predict_representation, embeds, prompt)
        representation = Forward(flops, weight_bytes(pipe.mllm))
        unconditional, single, pair = denoise_forwards(pipe)
        vae = vae_forward(pipe)
    return Counted(state_ours, state_release, representation, unconditional, single, pair, vae)


def cuts(release: SamplerConfig) -> dict[str, SamplerConfig]:
    """The sampler cuts compared, each a setting away from the release's sampler."""
    return {
        "ours with the skip set to 0 (alone where w is exactly 1)": release,
        "ours by default: skip the half where w - 1 <= 0.001": replace(release, skip_unconditional_below=1e-3),
        "skip the unconditional half, w - 1 <= 0.01": replace(release, skip_unconditional_below=1e-2),
        "30 steps": replace(release, num_steps=30),
        "20 steps": replace(release, num_steps=20),
        "20 steps, skip w - 1 <= 0.001": replace(release, num_steps=20, skip_unconditional_below=1e-3),
    }


def tera(flops: float) -> str:
    return f"{flops / 1e12:,.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="full", help="full (the published sizes) or tiny")
    parser.add_argument("--history", type=int, default=0, help="past turns in the prompt (0..4; the game's default 0)")
    args = parser.parse_args()

    config = get_config(args.model)
    counted_forwards = count(config, args.history)
    release = counted_forwards.turn(config.sampler, release=True)
    print(
        f"one turn of the {config.name} model, {config.num_frames} frames at {config.height}x{config.width}, "
        f"{args.history} past turns (TFLOP, counted on the meta device)\n"
    )
    print(f"{'stage':<22}{'release':>12}{'ours':>12}")
    ours_default = counted_forwards.turn(config.sampler)
    for stage in release.stages:
        print(f"{stage:<22}{tera(release.flops(stage)):>12}{tera(ours_default.flops(stage)):>12}")
    print(f"{'turn':<22}{tera(release.flops()):>12}{tera(ours_default.flops()):>12}")
    print(
        f"\nper forward: decoder {tera(counted_forwards.single.flops)} (conditional half), "
        f"{tera(counted_forwards.pair.flops)} (CFG pair); MLLM prompt {tera(counted_forwards.state_ours[0].flops)}, "
        f"one generated token {counted_forwards.state_release[1].flops / 1e9:,.1f} GFLOP\n"
    )

    peak_s = release.seconds()
    print(f"{'way of playing a turn':<56}{'TFLOP':>10}{'/release':>10}{'H200 floor':>12}{'at 40%':>10}")
    print(
        f"{'the release (200-token state pass, 50 steps, CFG pair)':<56}{tera(release.flops()):>10}"
        f"{1.0:>10.2f}{peak_s:>11.2f}s{release.seconds(H200_BF16_DENSE * SUSTAINED):>9.2f}s"
    )
    for name, sampler in cuts(config.sampler).items():
        work = counted_forwards.turn(sampler)
        print(
            f"{name:<56}{tera(work.flops()):>10}{work.flops() / release.flops():>10.2f}"
            f"{work.seconds():>11.2f}s{work.seconds(H200_BF16_DENSE * SUSTAINED):>9.2f}s"
        )
    print(
        f"\nH200: {H200_BF16_DENSE / 1e12:.1f} TFLOP/s dense bf16, {H200_BANDWIDTH / 1e12:.1f} TB/s (NVIDIA's "
        f"datasheet); 'floor' at the peak, '{SUSTAINED:.0%}' at that fraction of it. Each forward is the longer of "
        "its compute and reading its weights once."
    )


if __name__ == "__main__":
    main()
