"""Phase (a): learn the clip representation by reconstruction.

``ClipEncoder`` turns a clip's latents and its instruction into the 226-token representation; ``AnimeGamerDecoder``
learns to predict the clip's VAE latents back from it, with the clip's motion scope (``flow_for(motion level)``) as an
extra input. Both train together under one v-prediction loss on the release's noise schedule, so the decoder learns
the same task it does at inference, where the MLLM supplies the representation instead.

Two stages, both on the shared loop (checkpoints, resume, seeds):

1. The VAE: the tiny CogVideoX VAE, initialised from ``vae_seed``, trains as an autoencoder on the training clips for
   ``TrainConfig.vae_steps`` (pixel MSE in [-1, 1] on random ``vae_frames``-long crops, plus a small KL term on the
   posterior), with its state under ``out/vae/state``. A random decoder does not invert its encoder, so without this
   decoded pixels could never show what the decoder learned.
2. Encoder + decoder: the VAE is then frozen and each clip's latents computed once, since they never change; the
   stage's state is ``out/state``, and its sizes record the VAE's trained steps.

The VAE stage always finishes before the first checkpoint of the second stage, so a rerun after a stop either
continues the VAE's training or loads its finished state (training nothing) and resumes the second stage on the
very same latents.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
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
from training.toyworld import character_mask
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.sampler import NUM_TRAIN_TIMESTEPS, release_alphas_cumprod
from worker.pipeline.vae import build_vae

logger = logging.getLogger(__name__)

OUTPUTS = ("encoder.pt", "decoder.pt", "vae.pt", "phase_a.json")
VAE_STAGE = "vae"  # the VAE stage's folder under ``out``


def build_initial_vae(config: ToyModelConfig) -> nn.Module:
    """The VAE before its training: random init from ``vae_seed``, in eval mode, no gradients."""
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
    weight = next(vae.parameters())
    out = []
    for chunk in clips.split(batch):
        x = chunk.to(device=weight.device, dtype=weight.dtype).permute(0, 2, 1, 3, 4)
        z = vae.encode(x).latent_dist.mean  # (n, C, F, h, w)
        out.append((z.permute(0, 2, 1, 3, 4) * scaling_factor).float().cpu())  # (n, F, C, h, w)
    return torch.cat(out)


def latent_scale(latents: torch.Tensor) -> float:
    """1 / std of the training latents, as Stable Diffusion chose its 0.18215: the noise schedule assumes unit
    variance, and a trained VAE's latents have whatever spread its small KL weight allowed."""
    return 1.0 / max(float(latents.float().std()), 1e-6)


class FrameSet(Dataset):
    """The frames `(T, 3, H, W)` of clips and where the character is in them `(T, 1, H, W)`, for the VAE stage."""

    def __init__(self, frames: torch.Tensor, figure: torch.Tensor) -> None:
        assert frames.shape[:2] == figure.shape[:2], "one figure mask per frame"
        self.frames, self.figure = frames, figure

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.frames[i], self.figure[i]


def collate_frames(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    frames, figure = zip(*items, strict=True)
    return {"frames": torch.stack(frames), "figure": torch.stack(figure)}  # (B, T, 3, H, W), (B, T, 1, H, W)


class VAEModel(nn.Module):
    """The VAE as an autoencoder; ``forward(batch, generator)`` is pixel MSE, the character's pixels weighted
    ``1 + figure_weight``, plus ``kl_weight`` times the KL."""

    def __init__(self, vae: nn.Module, kl_weight: float, frames: int, figure_weight: float = 0.0) -> None:
        super().__init__()
        self.vae, self.kl_weight, self.frames, self.figure_weight = vae, kl_weight, frames, figure_weight

    def forward(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        x, figure = batch["frames"], batch["figure"]  # (B, T, 3, H, W) in [-1, 1], (B, T, 1, H, W) bool
        T = x.shape[1]
        if 0 < self.frames < T:  # one random crop per step; the causal VAE is convolutional in time
            start = int(torch.randint(0, T - self.frames + 1, (1,), generator=generator, device=generator.device))
            x, figure = x[:, start : start + self.frames], figure[:, start : start + self.frames]
        x, figure = x.permute(0, 2, 1, 3, 4), figure.permute(0, 2, 1, 3, 4)  # (B, C, T, H, W), the VAE's layout
        posterior = self.vae.encode(x).latent_dist
        recon = self.vae.decode(posterior.sample(generator=generator)).sample
        kl = 0.5 * (posterior.mean.pow(2) + posterior.var - 1.0 - posterior.logvar).mean()
        weight = 1.0 + self.figure_weight * figure.float()  # (B, 1, T, H, W), broadcast over the colours
        return ((recon.float() - x.float()).pow(2) * weight).mean() + self.kl_weight * kl.float()


def train_vae(
    train_frames: FrameSet,
    eval_frames: FrameSet,
    config: TrainConfig,
    model_config: ToyModelConfig,
    out: Path,
) -> tuple[nn.Module, TrainResult]:
    """Stage 1: train the VAE on clips to ``config.vae_steps``, resuming from ``out/state``.

    Returns the trained VAE, frozen, and the stage's result (``step`` 0 when ``vae_steps`` is 0: the random init).
    """
    vae = build_initial_vae(model_config)
    if config.vae_steps == 0:
        return vae, TrainResult(step=0)
    stage = replace(
        config, steps=config.vae_steps, learning_rate=config.vae_learning_rate, batch_size=config.vae_batch_size
    )
    sizes = {k: v for k, v in model_config.sizes().items() if k.startswith(("vae", "clip."))}
    model = VAEModel(
        vae.train().requires_grad_(True), config.vae_kl_weight, config.vae_frames, config.vae_figure_weight
    )
    eval_set = eval_frames if len(eval_frames) else None
    result, model, _ = train(
        model, train_frames, eval_set, collate_frames, stage, out, sizes, description="phase a vae"
    )
    return model.vae.eval().requires_grad_(False), result


class ClipSet(Dataset):
    """Every clip of some episodes: frames, instruction, motion scope and, once ``encode`` ran, the VAE's latents."""

    def __init__(self, episodes: tuple[Episode, ...]) -> None:
        self.episodes = episodes
        frames, self.instructions, self.flows = [], [], []
        for episode in episodes:
            clips = frames_to_tensor(episode.frames())  # (turns, T, 3, H, W)
            for index, clip in enumerate(episode.clips):
                frames.append(clips[index])
                self.instructions.append(clip.instruction)
                self.flows.append(flow_for(clip.motion))
        self.frames = torch.stack(frames) if frames else torch.empty(0)  # (N, T, 3, H, W)
        figure = [torch.from_numpy(character_mask(episode.frames(), episode.world.character)) for episode in episodes]
        self.figure = torch.cat(figure).unsqueeze(2) if figure else torch.empty(0, dtype=torch.bool)  # (N, T, 1, H, W)
        self.latents = torch.empty(0)
        self.cells = torch.empty(0)  # (N, F, 1, h, w): how much of each latent cell is the character, once encoded

    def frame_set(self) -> FrameSet:
        """The clips with where their character is (``character_mask``), for the VAE stage's weighted loss."""
        return FrameSet(self.frames, self.figure)

    def encode(self, vae: nn.Module, scaling_factor: float) -> None:
        """Compute every clip's latents with the (frozen) ``vae``."""
        if len(self.frames):
            self.latents = encode_latents(vae, self.frames, scaling_factor)
            self.cells = figure_cells(self.figure, self.latents.shape[1], self.latents.shape[-2:])

    @classmethod
    def encoded(cls, episodes: tuple[Episode, ...], vae: nn.Module, scaling_factor: float, chunk: int = 64) -> ClipSet:
        """The clips' latents, cells, instructions and motion scopes without their frames, encoded ``chunk``
        episodes at a time: phases (b) and (c) need no pixels, and a data set's frames as floats are 1.25 MB a clip.
        """
        parts = [cls(episodes[start : start + chunk]) for start in range(0, len(episodes), chunk)]
        merged = cls(())
        for part in parts:
            part.encode(vae, scaling_factor)
            merged.instructions += part.instructions
            merged.flows += part.flows
        merged.episodes = episodes
        if parts:
            merged.latents = torch.cat([part.latents for part in parts])
            merged.cells = torch.cat([part.cells for part in parts])
        return merged

    def __len__(self) -> int:
        return len(self.instructions)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str, float]:
        return self.frames[i], self.latents[i], self.cells[i], self.instructions[i], self.flows[i]


def figure_cells(figure: torch.Tensor, frames: int, grid: tuple[int, int]) -> torch.Tensor:
    """The share of each latent cell `(N, F, 1, h, w)` that is the character, from pixel masks `(N, T, 1, H, W)`.

    The causal VAE makes latent frame 0 from frame 0 alone and each later one from the next ``(T - 1) / (F - 1)``
    frames; a cell spans ``H / h`` by ``W / w`` pixels.
    """
    N, T = figure.shape[:2]
    pixels = F.adaptive_avg_pool2d(figure.flatten(0, 2).float(), grid).view(N, T, *grid)  # (N, T, h, w)
    rest = pixels[:, 1:].reshape(N, frames - 1, (T - 1) // (frames - 1), *grid).mean(dim=2)  # (N, F - 1, h, w)
    return torch.cat([pixels[:, :1], rest], dim=1).unsqueeze(2)


@dataclass
class Collate:
    max_bytes: int

    def __call__(self, items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, str, float]]) -> dict[str, Any]:
        frames, latents, cells, texts, flows = zip(*items, strict=True)
        return {
            "frames": torch.stack(frames),  # (B, T, 3, H, W)
            "latents": torch.stack(latents),  # (B, F, C, h, w)
            "cells": torch.stack(cells),  # (B, F, 1, h, w)
            "instruction": instruction_bytes(list(texts), self.max_bytes),  # (B, L)
            "flow": torch.tensor(flows, dtype=torch.float32),  # (B,)
        }


class PhaseAModel(nn.Module):
    """Encoder + decoder; ``forward(batch, generator)`` is the phase-(a) v-prediction loss."""

    def __init__(self, config: ToyModelConfig, figure_weight: float = 0.0) -> None:
        super().__init__()
        self.figure_weight = figure_weight
        self.encoder = ClipEncoder(config)
        self.decoder = AnimeGamerDecoder.from_pipeline_config(config.pipeline.decoder)
        alphas = release_alphas_cumprod(config.pipeline.sampler.shift_scale).float()  # float32 is plenty for a loss
        self.register_buffer("alphas_cumprod", alphas, persistent=False)

    def forward(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        condition = self.encoder(batch["latents"], batch["instruction"])  # (B, 226, D): the clip's own
        weight = 1.0 + self.figure_weight * batch["cells"]
        return v_prediction_loss(
            self.decoder, self.alphas_cumprod, batch["latents"], condition, batch["flow"], generator, weight
        )


def v_prediction_loss(
    decoder: AnimeGamerDecoder,
    alphas_cumprod: torch.Tensor,
    x0: torch.Tensor,
    condition: torch.Tensor,
    flow: torch.Tensor,
    generator: torch.Generator,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The decoder's objective in phases (a) and (c): latents `(B, F, C, h, w)` noised on the release's schedule
    (t uniform, x_t = sqrt(a) x0 + sqrt(1 - a) eps), v predicted from the condition `(B, 226, D)` and motion scope.

    ``weight`` `(B, F, 1, h, w)` weighs each latent cell's error: where the character is weighs more
    (``TrainConfig.figure_weight``), so the decoder does not spend itself on the scenery alone."""
    B = x0.shape[0]
    t = torch.randint(0, NUM_TRAIN_TIMESTEPS, (B,), generator=generator, device=x0.device)
    eps = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    a = alphas_cumprod[t].view(B, 1, 1, 1, 1)
    x_t = a.sqrt() * x0 + (1 - a).sqrt() * eps
    target = a.sqrt() * eps - (1 - a).sqrt() * x0  # v
    v = decoder(x_t, t, condition, flow)
    if weight is None:
        return F.mse_loss(v.float(), target.float())
    return ((v.float() - target.float()).pow(2) * weight).mean()


@dataclass
class PhaseAResult(TrainResult):
    vae_losses: dict[int, float] = field(default_factory=dict)  # the VAE stage's step -> loss, this run only
    vae_step: int = 0  # the VAE stage's last finished step
    scaling_factor: float = 1.0  # latents = VAE posterior mean x this (training.phase_a.latent_scale)


def train_phase_a(
    data: Path,
    out: Path,
    config: TrainConfig | None = None,
    model_config: ToyModelConfig | None = None,
    on_step: OnStep | None = None,
) -> PhaseAResult:
    """Train phase (a) on the toy-world folder ``data``: the VAE (``out/vae``), then encoder + decoder (``out``)."""
    config = config or TrainConfig()
    model_config = model_config or ToyModelConfig()
    out = Path(out)

    # 1. Data: verified folder, fixed held-out split
    world = load_toyworld(Path(data))  # raises DatasetError for an empty or half-written folder
    training, held_out = split(world, config.held_out_every)
    if not training:
        raise DatasetError(f"{data} has no training episodes after holding out every {config.held_out_every}th.")
    train_set, eval_set = ClipSet(training), ClipSet(held_out)
    logger.info("phase a: %d training clips, %d held out", len(train_set), len(eval_set))

    # 2. Stage 1: the VAE as an autoencoder, then frozen; latents once per clip, scaled to unit variance
    vae, vae_result = train_vae(train_set.frame_set(), eval_set.frame_set(), config, model_config, out / VAE_STAGE)
    train_set.encode(vae, 1.0)
    scaling = latent_scale(train_set.latents)
    train_set.latents = train_set.latents * scaling
    eval_set.encode(vae, scaling)
    sizes = model_config.sizes() | {"vae.trained_steps": vae_result.step}  # other latents: refuse the old state

    # 3. Stage 2: model from the seed, then the shared loop
    torch.manual_seed(config.seed)
    model = PhaseAModel(model_config, config.figure_weight)
    dit_result, model, accelerator = train(
        model,
        train_set,
        eval_set,
        Collate(model_config.max_instruction_bytes),
        config,
        out,
        sizes,
        on_step=on_step,
        description="phase a",
    )
    result = PhaseAResult(
        step=dit_result.step,
        losses=dit_result.losses,
        eval_losses=dit_result.eval_losses,
        vae_losses=vae_result.losses,
        vae_step=vae_result.step,
        scaling_factor=scaling,
    )

    # 4. The trained modules, for phase (b) and inference
    if accelerator.is_main_process:
        torch.save(model.encoder.state_dict(), out / "encoder.pt")
        torch.save(model.decoder.state_dict(), out / "decoder.pt")
        torch.save(vae.state_dict(), out / "vae.pt")
        meta = {
            "phase": "a",
            "step": result.step,
            "vae_step": result.vae_step,
            "scaling_factor": scaling,
            "sizes": sizes,
        }
        (out / "phase_a.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    accelerator.wait_for_everyone()
    return result
