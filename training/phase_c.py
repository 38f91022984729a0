"""Phase (c): the decoder adapts to the MLLM's predicted representations.

Phase (a) taught the decoder to rebuild a clip from the encoder's representation of that very clip. At inference the
condition is the MLLM's prediction instead, close to the encoder's but not equal, and decoding it shows artifacts.
Here phase (a)'s decoder keeps its v-prediction objective, conditioned on what phase (b)'s MLLM predicts for each
training turn from the same prompts. A share of the conditions (``UNCONDITIONAL``) is the decoder's unconditional
tokens, so classifier-free guidance at inference has a real unconditional prediction to push away from.

The frozen inputs (latents, predictions) are computed once, before the loop; the loop trains the decoder alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from training.config import ToyModelConfig, TrainConfig
from training.dataset import DatasetError, Episode, load_toyworld, split
from training.loop import TrainResult, train
from training.phase_a import ClipSet, build_initial_vae, v_prediction_loss
from training.phase_b import OUTPUTS as B_OUTPUTS
from training.phase_b import (
    PhaseBModel,
    check_sizes,
    own_predictions,
    prompt_data,
    read_phase,
    read_phase_a,
    without_history,
)
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.sampler import release_alphas_cumprod

logger = logging.getLogger(__name__)

OUTPUTS = ("decoder.pt", "phase_c.json")
UNCONDITIONAL = 0.15  # share of training conditions replaced by the unconditional tokens


def predict_representations(
    mllm_model: PhaseBModel, episodes: tuple[Episode, ...], config: ToyModelConfig
) -> torch.Tensor:
    """Phase (b)'s prediction for every turn of ``episodes`` as the game makes it by default, from the turn's
    instruction alone (``Settings.history_window`` 1), in ClipSet order: `(N, 226, D)`. No targets are needed, so
    no encoder."""
    prompts = without_history(prompt_data(episodes, torch.empty(0), config, config.tokenizer()))
    return own_predictions(mllm_model.mllm, prompts)


class AdaptSet(Dataset):
    """Latents, the MLLM's predicted representation and the motion scope of each clip."""

    def __init__(self, clips: ClipSet, predicted: torch.Tensor) -> None:
        self.latents, self.cells, self.predicted, self.flows = clips.latents, clips.cells, predicted, clips.flows

    def __len__(self) -> int:
        return len(self.flows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        return self.latents[i], self.cells[i], self.predicted[i], self.flows[i]


def collate(items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]]) -> dict[str, torch.Tensor]:
    latents, cells, predicted, flows = zip(*items, strict=True)
    return {
        "latents": torch.stack(latents),  # (B, F, C, h, w)
        "cells": torch.stack(cells),  # (B, F, 1, h, w): the character's share of each latent cell
        "condition": torch.stack(predicted),  # (B, 226, D)
        "flow": torch.tensor(flows, dtype=torch.float32),  # (B,)
    }


def some_unconditional(decoder: AnimeGamerDecoder, condition: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``condition`` (B, 226, D) with a share ``UNCONDITIONAL`` of its rows replaced by the unconditional tokens."""
    size = condition.shape[0]
    drop = torch.rand(size, generator=generator, device=condition.device) < UNCONDITIONAL  # (B,)
    unconditional = decoder.unconditional_tokens(size).to(condition.dtype)
    return torch.where(drop[:, None, None], unconditional, condition)


class PhaseCModel(nn.Module):
    """The decoder; ``forward(batch, generator)`` is the v-prediction loss on the MLLM's predicted conditions."""

    def __init__(self, decoder: AnimeGamerDecoder, shift_scale: float, figure_weight: float = 0.0) -> None:
        super().__init__()
        self.decoder, self.figure_weight = decoder, figure_weight
        self.register_buffer("alphas_cumprod", release_alphas_cumprod(shift_scale).float(), persistent=False)

    def forward(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        condition = some_unconditional(self.decoder, batch["condition"], generator)  # (B, 226, D)
        weight = 1.0 + self.figure_weight * batch["cells"]
        return v_prediction_loss(
            self.decoder, self.alphas_cumprod, batch["latents"], condition, batch["flow"], generator, weight
        )


@dataclass
class PhaseCResult(TrainResult):
    scaling_factor: float = 1.0


def train_phase_c(
    data: Path,
    out: Path,
    phase_a: Path,
    phase_b: Path,
    config: TrainConfig | None = None,
    model_config: ToyModelConfig | None = None,
) -> PhaseCResult:
    """Adapt phase (a)'s decoder to phase (b)'s predictions on ``data``; saves ``out/decoder.pt``."""
    config = config or TrainConfig()
    model_config = model_config or ToyModelConfig()
    out, phase_a, phase_b = Path(out), Path(phase_a), Path(phase_b)

    # 1. The earlier phases' outputs, refused by name when missing or of other sizes
    meta_a = read_phase_a(phase_a, model_config)
    meta_b = read_phase(phase_b, "phase-b", B_OUTPUTS)
    check_sizes(meta_b, model_config.sizes() | model_config.mllm_sizes(), phase_b / "phase_b.json")
    tokenizer = model_config.tokenizer()
    mllm_model = PhaseBModel(model_config, tokenizer)
    mllm_model.mllm.load_state_dict(torch.load(phase_b / "mllm.pt", weights_only=True))
    vae = build_initial_vae(model_config)
    vae.load_state_dict(torch.load(phase_a / "vae.pt", weights_only=True))
    scaling = float(meta_a["scaling_factor"])

    # 2. Frozen inputs once: latents and the MLLM's predictions
    world = load_toyworld(Path(data))
    training, held_out = split(world, config.held_out_every)
    if not training:
        raise DatasetError(f"{data} has no training episodes after holding out every {config.held_out_every}th.")
    sets = []
    for episodes in (training, held_out):
        clips = ClipSet.encoded(episodes, vae, scaling)  # the latents are all the loop needs
        sets.append(AdaptSet(clips, predict_representations(mllm_model, episodes, model_config)))
    logger.info("phase c: %d training clips, %d held out", len(sets[0]), len(sets[1]))
    sizes = model_config.sizes() | model_config.mllm_sizes()
    sizes |= {"phase_a.step": meta_a["step"], "phase_b.step": meta_b["step"]}

    # 3. The decoder from phase (a), then the shared loop
    decoder = AnimeGamerDecoder.from_pipeline_config(model_config.pipeline.decoder)
    decoder.load_state_dict(torch.load(phase_a / "decoder.pt", weights_only=True))
    model = PhaseCModel(decoder, model_config.pipeline.sampler.shift_scale, config.figure_weight)
    result, model, accelerator = train(
        model, sets[0], sets[1] if len(sets[1]) else None, collate, config, out, sizes, description="phase c"
    )
    if accelerator.is_main_process:
        torch.save(model.decoder.state_dict(), out / "decoder.pt")
        meta: dict[str, Any] = {"phase": "c", "step": result.step, "scaling_factor": scaling, "sizes": sizes}
        (out / "phase_c.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    accelerator.wait_for_everyone()
    return PhaseCResult(result.step, result.losses, result.eval_losses, scaling_factor=scaling)
