"""How much GPU memory a worker needs at each stage of a turn, before any weight is loaded.

A turn has four stages: the MLLM's state pass and representation pass, the decoder's denoising
loop, the VAE decode. What sits on the GPU in each follows from the placement, the same
``Placement`` the pipeline moves its modules by (``AnimeGamerPipeline.mllm_phase`` and
``decoder_phase``): a resident part stays on the GPU, an offloaded part lives in host memory and
visits the GPU for its own stage only. With several characters the MLLM base is shared; each
character adds its trained MLLM parts and its own decoder (worker/pipeline/characters.py).

Weights are counted exactly (modules built on the ``meta`` device). Activations are estimates per
stage (``ACTIVATION_GIB``) until benchmarks/full_turn_gpu.py has measured them on a GPU. The point
is to refuse early, with the numbers and the setting that lowers them, instead of failing with
out-of-memory halfway through a turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.pipeline.characters import is_character_parameter, lora_targets
from worker.pipeline.config import PipelineConfig, full
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.tokenizer import added_token_names
from worker.pipeline.vae import build_vae

GIB = 2**30
STAGES = ("state_pass", "representation_pass", "denoise", "vae")
MLLM_STAGES = ("state_pass", "representation_pass")
# At the published sizes; not measured yet (no GPU lent so far), so deliberately generous guesses. The MLLM
# passes run a prompt of a few hundred tokens (KV cache, one set of logits); denoising runs the DiT on 6,976
# tokens x batch 2; the VAE decodes 17 frames at 480x720 in temporal chunks. Other sizes scale them by width
# and tokens (``_activation_scale``), so a tiny tree's plan is not the published model's.
ACTIVATION_GIB = {"state_pass": 1.0, "representation_pass": 1.0, "denoise": 6.0, "vae": 6.0}


class NotEnoughGPUMemory(ValueError):
    """No placement fits the GPU; the message gives what each would need."""


@dataclass(frozen=True)
class Placement:
    """Which parts live in host memory and visit the GPU only for their stage."""

    offload_mllm: bool = False  # the MLLM base and the turn's character parts, for the two MLLM passes
    offload_decoder: bool = False  # the turn's character's decoder, for denoising; the others stay on the host

    def describe(self) -> str:
        moved = [name for name, on in (("MLLM", self.offload_mllm), ("decoder", self.offload_decoder)) if on]
        return "everything resident" if not moved else " and ".join(moved) + " offloaded"


PLACEMENTS = (Placement(), Placement(False, True), Placement(True, False), Placement(True, True))


@dataclass(frozen=True)
class MemoryPlan:
    characters: int
    mllm_shared_bytes: int  # the base's adapted projections (and rotary tables), held once
    mllm_character_bytes: int  # each character's: norms, embedding and head, resamplers, LoRA factors
    decoder_bytes: int  # each character's
    vae_bytes: int
    mllm_params: int  # one character's MLLM without LoRA factors: the published parameter count
    decoder_params: int
    vae_params: int
    activation_bytes: dict[str, int]  # per stage, estimated

    def weights_on_gpu(self, stage: str, placement: Placement) -> int:
        """Bytes of weights on the GPU during ``stage``: exactly what the pipeline's phases leave there."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; one of {', '.join(STAGES)}")
        total = self.vae_bytes
        if not placement.offload_mllm:
            total += self.mllm_shared_bytes + self.characters * self.mllm_character_bytes
        elif stage in MLLM_STAGES:
            total += self.mllm_shared_bytes + self.mllm_character_bytes  # the turn's character only
        if not placement.offload_decoder:
            total += self.characters * self.decoder_bytes
        elif stage == "denoise":
            total += self.decoder_bytes
        return total

    def stage_bytes(self, stage: str, placement: Placement) -> int:
        return self.weights_on_gpu(stage, placement) + self.activation_bytes[stage]

    def peak(self, placement: Placement) -> int:
        return max(self.stage_bytes(stage, placement) for stage in STAGES)

    def moved_per_turn(self, placement: Placement) -> int:
        """Bytes copied to the GPU each turn: what an offloaded placement costs in time."""
        mllm = self.mllm_shared_bytes + self.mllm_character_bytes
        return mllm * placement.offload_mllm + self.decoder_bytes * placement.offload_decoder

    def choose(self, free_bytes: int, allowed: tuple[Placement, ...] = PLACEMENTS, model: str = "") -> Placement:
        """The placement that fits ``free_bytes`` and moves the least each turn, or the numbers for each."""
        fitting = [p for p in allowed if self.peak(p) <= free_bytes]
        if fitting:
            return min(fitting, key=self.moved_per_turn)
        needs = "; ".join(f"{p.describe()} {self.peak(p) / GIB:.1f} GiB" for p in allowed)
        who = f"{self.characters} character{'s' if self.characters > 1 else ''}"
        raise NotEnoughGPUMemory(
            f"This GPU has {free_bytes / GIB:.1f} GiB free; the {model or 'model'} with {who} needs: {needs}. "
            "Serve fewer characters per worker (ANIMEGAMER_CHARACTERS), allow offloading "
            "(ANIMEGAMER_OFFLOAD_MLLM, ANIMEGAMER_OFFLOAD_DECODER), or use a larger GPU."
        )

    def table(self) -> list[str]:
        """One line per placement: peak and each stage, for ``animegamer checkpoints check``."""
        lines = []
        for placement in PLACEMENTS:
            stages = ", ".join(f"{s} {self.stage_bytes(s, placement) / GIB:.1f}" for s in STAGES)
            lines.append(f"{placement.describe():32} peak {self.peak(placement) / GIB:5.1f} GiB ({stages})")
        return lines


def allowed_placements(offload_mllm: str = "auto", offload_decoder: str = "auto") -> tuple[Placement, ...]:
    """The placements the settings allow: ``on`` / ``off`` pin a part, ``auto`` lets the plan choose."""
    pins = {"on": (True,), "off": (False,), "auto": (False, True)}
    for value in (offload_mllm, offload_decoder):
        if value not in pins:
            raise ValueError(f"offload setting {value!r}: use auto, on or off")
    return tuple(
        p for p in PLACEMENTS if p.offload_mllm in pins[offload_mllm] and p.offload_decoder in pins[offload_decoder]
    )


def plan(
    config: PipelineConfig,
    mllm_dtype: torch.dtype,
    decoder_dtype: torch.dtype,
    *,
    characters: int = 1,
    lora_rank: int = 0,
) -> MemoryPlan:
    """Bytes per part at ``config``'s sizes; ``lora_rank`` > 0 adds each character's unmerged LoRA factors."""
    with torch.device("meta"):
        mllm = AnimeGamerMLLM(
            config.mllm,
            config.mllm.base_vocab_size + len(added_token_names()),
            config.decoder.hidden_size,
            num_query_tokens=config.num_query_tokens,
        )
        decoder = AnimeGamerDecoder.from_pipeline_config(config.decoder)
        vae = build_vae(config.vae)
    shared = sum(p.numel() for name, p in mllm.named_parameters() if not is_character_parameter(name))
    own = sum(p.numel() for name, p in mllm.named_parameters() if is_character_parameter(name))
    lora = sum(
        lora_rank * (m.in_features + m.out_features) for m in (mllm.get_submodule(path) for path in lora_targets(mllm))
    )
    decoder_params = sum(p.numel() for p in decoder.parameters())
    vae_params = sum(p.numel() for p in vae.parameters())
    buffers = sum(b.numel() * b.element_size() for b in mllm.buffers())  # the rotary tables, float32
    return MemoryPlan(
        characters=characters,
        mllm_shared_bytes=shared * mllm_dtype.itemsize + buffers,
        mllm_character_bytes=(own + lora) * mllm_dtype.itemsize,
        decoder_bytes=decoder_params * decoder_dtype.itemsize,
        vae_bytes=vae_params * decoder_dtype.itemsize,
        mllm_params=shared + own,
        decoder_params=decoder_params,
        vae_params=vae_params,
        activation_bytes={
            stage: int(ACTIVATION_GIB[stage] * GIB * _activation_scale(config, stage)) for stage in STAGES
        },
    )


def _activation_scale(config: PipelineConfig, stage: str) -> float:
    """How much smaller (or larger) ``config``'s activations are than the published model's at ``stage``."""
    published = full()
    if stage in MLLM_STAGES:
        return config.mllm.hidden_size / published.mllm.hidden_size
    pixels = (
        config.num_frames * config.height * config.width / (published.num_frames * published.height * published.width)
    )
    if stage == "denoise":
        return pixels * config.decoder.hidden_size / published.decoder.hidden_size
    return pixels * max(config.vae.block_out_channels) / max(published.vae.block_out_channels)
