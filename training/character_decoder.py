"""Phases (a) and (c) for the published architecture: the decoder's LoRA learns a character by v-prediction.

Both phases train peft's LoRA on the attention's q, k, v and output projections (``DECODER_LORA``,
the release's r=64 at scale 1/64, written back as SAT's lora2 by ``training.release_export``) and the motion-scope
embedding, on the release's noise schedule (``training.phase_a.v_prediction_loss``); the rest of the decoder stays
as published. They differ in the condition:

- (a) the clip encoder's representation: the clip's frozen T5 text features (30 x 4096) and OpenCLIP image features
  (196 x 768), computed once before training, through the decoder's own text and image projections and their norms,
  which train with it;
- (c) the MLLM's prediction for the clip's turn, made once by phase (b)'s model.

A share of the conditions (``training.phase_c.UNCONDITIONAL``, as the toy's phase (c)) is the decoder's
unconditional tokens, so classifier-free guidance at inference has a real unconditional prediction to push away from.
"""

from __future__ import annotations

import torch
from peft import LoraConfig, inject_adapter_in_model
from torch import nn

from training.phase_a import v_prediction_loss
from training.phase_c import some_unconditional
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.sampler import release_alphas_cumprod

CLIP_PROJECTIONS = ("text_proj", "text_norm", "ip_proj", "ip_norm")
# The release's cogvideox_2b.yaml: lora r 64 on the fused qkv and the attention output, lora_alpha left at 1
DECODER_LORA = LoraConfig(r=64, lora_alpha=1, target_modules=["to_q", "to_k", "to_v", "to_out.0"])


def trainable_decoder(decoder: AnimeGamerDecoder, phase: str, checkpointing: bool = True) -> AnimeGamerDecoder:
    """peft's LoRA into ``decoder``, and what else ``phase`` ("a" or "c") trains; everything else frozen. With
    ``checkpointing`` each block keeps only its inputs for the backward pass (what ``training.plan`` counts)."""
    if phase not in ("a", "c"):
        raise ValueError(f"the decoder trains in phases a and c, not {phase!r}")
    if not any("lora_" in name for name, _ in decoder.named_parameters()):  # phase (c) goes on with (a)'s LoRA
        inject_adapter_in_model(DECODER_LORA, decoder)
    parts = ("lora_", "flow_embedding", *(CLIP_PROJECTIONS if phase == "a" else ()))
    for name, param in decoder.named_parameters():
        param.requires_grad_(any(part in name for part in parts))
    if checkpointing:
        decoder.enable_gradient_checkpointing()
    return decoder


def clip_condition(decoder: AnimeGamerDecoder, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """Phase (a)'s representation ``(B, 226, D)`` from frozen text ``(B, 30, 4096)`` and image ``(B, 196, 768)``
    features, in the order the decoder's condition slots hold them: 30 text, then 196 image."""
    return torch.cat([decoder.text_norm(decoder.text_proj(text)), decoder.ip_norm(decoder.ip_proj(image))], dim=1)


def stack(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The decoder phases' collate: samples of same-shaped tensors into a batch, key by key."""
    return {key: torch.stack([item[key] for item in items]) for key in items[0]}


class DecoderPhase(nn.Module):
    """The decoder; ``forward(batch, generator)`` is the v-prediction loss, as ``training.loop`` calls it.

    A batch holds ``latents`` (B, F, C, h, w), ``flow`` (B,) and either ``condition`` (B, 226, D) (phase c) or
    ``text`` and ``image`` features (phase a)."""

    def __init__(self, decoder: AnimeGamerDecoder, shift_scale: float = 3.0) -> None:
        super().__init__()
        self.decoder = decoder
        self.register_buffer("alphas_cumprod", release_alphas_cumprod(shift_scale).float(), persistent=False)

    def forward(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        if "condition" in batch:
            condition = batch["condition"]
        else:
            condition = clip_condition(self.decoder, batch["text"], batch["image"])
        condition = some_unconditional(self.decoder, condition, generator)
        return v_prediction_loss(
            self.decoder, self.alphas_cumprod, batch["latents"], condition, batch["flow"], generator
        )
