"""Phase (a): learn the clip representation by reconstruction.

``ClipEncoder`` turns a clip and its instruction into the 226-token representation; ``AnimeGamerDecoder`` learns to
predict the clip's VAE latents back from it, with the clip's motion scope (``flow_for(motion level)``) as an extra
input. Both train together under one v-prediction loss on the release's noise schedule, so the decoder learns the
same task it does at inference, where the MLLM supplies the representation instead.

The VAE is a documented fixed choice (see ``ToyModelConfig``): the tiny CogVideoX VAE randomly initialised from
``vae_seed`` and frozen. Its latents are computed once per clip before training, since they never change.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from game.motion import flow_for
from training.config import ToyModelConfig, TrainConfig
from training.dataset import DatasetError, Episode, load_toyworld, split
from training.encoder import ClipEncoder, instruction_bytes
from training.loop import OnStep, TrainResult, train
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.sampler import NUM_TRAIN_TIMESTEPS, release_alphas_cumprod
from worker.pipeline.vae import build_vae

logger = logging.getLogger(__name__)

OUTPUTS = ("encoder.pt", "decoder.pt", "vae.pt", "phase_a.json")


def build_fixed_vae(config: ToyModelConfig) -> nn.Module:
    """The frozen VAE phase (a) encodes with: random init from ``vae_seed``, no gradients."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(config.vae_seed)
    vae = build_vae(config.pipeline.vae).eval().requires_grad_(False)
    torch.random.set_rng_state(generator_state)  # leave the caller's seed where it was
    return vae


def frames_to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 `(..., T, H, W, 3)` -> float `(..., T, 3, H, W)` in [-1, 1]."""
    x = torch.from_numpy(frames).float() / 127.5 - 1.0
    return x.movedim(-1, -3)


@torch.no_grad()
def encode_latents(vae: nn.Module, clips: torch.Tensor, scaling_factor: float, batch: int = 4) -> torch.Tensor:
    """Clips `(N, T, 3, H, W)` -> scaled posterior-mean latents `(N, F, C, h, w)`, the decoder's layout."""
    out = []
    for chunk in clips.split(batch):
        z = vae.encode(chunk.permute(0, 2, 1, 3, 4)).latent_dist.mean  # (n, C, F, h, w)
        out.append(z.permute(0, 2, 1, 3, 4) * scaling_factor)  # (n, F, C, h, w)
    return torch.cat(out)


class ClipSet(Dataset):
    """Every clip of some episodes: frames, instruction, motion scope and the fixed VAE's latents."""

    def __init__(self, episodes: tuple[Episode, ...], vae: nn.Module, scaling_factor: float) -> None:
        frames, self.instructions, self.flows = [], [], []
        for episode in episodes:
            clips = frames_to_tensor(episode.frames())  # (turns, T, 3, H, W)
            for index, clip in enumerate(episode.clips):
                frames.append(clips[index])
                self.instructions.append(clip.instruction)
                self.flows.append(flow_for(clip.motion))
        self.frames = torch.stack(frames) if frames else torch.empty(0)  # (N, T, 3, H, W)
        self.latents = encode_latents(vae, self.frames, scaling_factor) if frames else torch.empty(0)

    def __len__(self) -> int:
        return len(self.instructions)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, str, float]:
        return self.frames[i], self.latents[i], self.instructions[i], self.flows[i]


@dataclass
class Collate:
    max_bytes: int

    def __call__(self, items: list[tuple[torch.Tensor, torch.Tensor, str, float]]) -> dict[str, Any]:
        frames, latents, texts, flows = zip(*items, strict=True)
        return {
            "frames": torch.stack(frames),  # (B, T, 3, H, W)
            "latents": torch.stack(latents),  # (B, F, C, h, w)
            "instruction": instruction_bytes(list(texts), self.max_bytes),  # (B, L)
            "flow": torch.tensor(flows, dtype=torch.float32),  # (B,)
        }


class PhaseAModel(nn.Module):
    """Encoder + decoder; ``forward(batch, generator)`` is the phase-(a) v-prediction loss."""

    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        self.encoder = ClipEncoder(config)
        self.decoder = AnimeGamerDecoder.from_pipeline_config(config.pipeline.decoder)
        alphas = release_alphas_cumprod(config.pipeline.sampler.shift_scale).float()  # float32 is plenty for a loss
        self.register_buffer("alphas_cumprod", alphas, persistent=False)

    def forward(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        x0 = batch["latents"]  # (B, F, C, h, w)
        B = x0.shape[0]
        # 1. Noise on the release's schedule: t uniform, x_t = sqrt(a) x0 + sqrt(1 - a) eps
        t = torch.randint(0, NUM_TRAIN_TIMESTEPS, (B,), generator=generator, device=x0.device)
        eps = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        a = self.alphas_cumprod[t].view(B, 1, 1, 1, 1)
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * eps
        target = a.sqrt() * eps - (1 - a).sqrt() * x0  # v
        # 2. Predict v from the clip's own representation and motion scope
        condition = self.encoder(batch["frames"], batch["instruction"])  # (B, 226, D)
        v = self.decoder(x_t, t, condition, batch["flow"])
        return F.mse_loss(v.float(), target.float())


def train_phase_a(
    data: Path,
    out: Path,
    config: TrainConfig | None = None,
    model_config: ToyModelConfig | None = None,
    on_step: OnStep | None = None,
) -> TrainResult:
    """Train phase (a) on the toy-world folder ``data``; state and the trained modules go to ``out``."""
    config = config or TrainConfig()
    model_config = model_config or ToyModelConfig()
    out = Path(out)

    # 1. Data: verified folder, fixed held-out split, latents from the fixed VAE
    world = load_toyworld(Path(data))  # raises DatasetError for an empty or half-written folder
    training, held_out = split(world, config.held_out_every)
    if not training:
        raise DatasetError(f"{data} has no training episodes after holding out every {config.held_out_every}th.")
    vae = build_fixed_vae(model_config)
    scaling = model_config.pipeline.vae.scaling_factor
    train_set, eval_set = ClipSet(training, vae, scaling), ClipSet(held_out, vae, scaling)
    logger.info("phase a: %d training clips, %d held out", len(train_set), len(eval_set))

    # 2. Model from the seed, then the shared loop
    torch.manual_seed(config.seed)
    model = PhaseAModel(model_config)
    result, model, accelerator = train(
        model,
        train_set,
        eval_set,
        Collate(model_config.max_instruction_bytes),
        config,
        out,
        model_config.sizes(),
        on_step=on_step,
        description="phase a",
    )

    # 3. The trained modules, for phase (b) and inference
    if accelerator.is_main_process:
        torch.save(model.encoder.state_dict(), out / "encoder.pt")
        torch.save(model.decoder.state_dict(), out / "decoder.pt")
        torch.save(vae.state_dict(), out / "vae.pt")
        meta = {"phase": "a", "step": result.step, "sizes": model_config.sizes()}
        (out / "phase_a.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    accelerator.wait_for_everyone()
    return result
