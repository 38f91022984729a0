"""What the character phases read, made once from a prepared data set (``animegamer data prepare``).

For each clip, keyed ``"<episode id>/<turn>"`` as ``training.character_phase_b.windows_from`` keys them:

    <key>/latents   (F, C, h, w)   the VAE's posterior mean of the clip x its scaling factor (what the decoder denoises)
    <key>/text      (30, W_t)      T5 over the clip's instruction (``training.frozen_encoders``)
    <key>/image     (196, W_i)     OpenCLIP over the clip's first frame
    <key>/flow      ()             the motion scope the game gives the clip's motion level (``game.motion.flow_for``)

in one safetensors file, written whole or not at all. The frozen encoders and the VAE run once here, so the phases
hold only the decoder or the MLLM: at the published sizes T5-XXL alone is 4.8 B parameters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLCogVideoX
from safetensors import safe_open
from safetensors.torch import save_file

from game.motion import flow_for
from training.dataset import EPISODES, DatasetError
from training.frozen_encoders import FrozenEncoders

INPUTS = "inputs.safetensors"
FIELDS = ("latents", "text", "image", "flow")


@dataclass(frozen=True)
class PreparedClip:
    key: str  # "<episode id>/<turn>"
    instruction: str
    motion: int
    frames: np.ndarray  # (T, H, W, 3) uint8


def prepared_clips(data: Path) -> Iterator[PreparedClip]:
    """Every clip of a prepared data set, episode by episode, turn by turn."""
    data = Path(data)
    if not (data / EPISODES).is_file():
        raise DatasetError(f"{data} has no {EPISODES}: give a folder written by `animegamer data prepare`")
    for line in (data / EPISODES).read_text().splitlines():
        episode = json.loads(line)
        with np.load(data / episode["file"]) as npz:
            frames = npz["frames"]  # (turns, T, H, W, 3)
        for index, turn in enumerate(episode["turns"]):
            yield PreparedClip(f"{episode['id']}/{index}", turn["instruction"], int(turn["motion"]), frames[index])


@torch.no_grad()
def encode_latents(vae: AutoencoderKLCogVideoX, frames: np.ndarray) -> torch.Tensor:
    """``(F, C, h, w)`` latents of uint8 frames ``(T, H, W, 3)``, scaled as the sampler's (``decode_latents``
    divides by the same factor). The posterior's mean, not a sample: the data set's latents are fixed."""
    weight = next(vae.encoder.parameters())
    video = torch.from_numpy(frames).to(weight.device).permute(3, 0, 1, 2)[None]  # (1, 3, T, H, W)
    video = (video.to(weight.dtype) / 127.5 - 1.0).contiguous()
    latents = vae.encode(video).latent_dist.mode() * vae.config.scaling_factor  # (1, C, F, h, w)
    return latents[0].permute(1, 0, 2, 3).float().cpu().contiguous()


def write_inputs(
    data: Path,
    vae: AutoencoderKLCogVideoX,
    encoders: FrozenEncoders,
    out: Path,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Encode every clip of ``data`` into ``out`` (a safetensors file); returns the number of clips."""
    tensors: dict[str, torch.Tensor] = {}
    for clip in prepared_clips(data):
        tensors[f"{clip.key}/latents"] = encode_latents(vae, clip.frames)
        tensors[f"{clip.key}/text"] = encoders.text([clip.instruction])[0].cpu().contiguous()
        tensors[f"{clip.key}/image"] = encoders.image(torch.from_numpy(clip.frames[:1]))[0].cpu().contiguous()
        tensors[f"{clip.key}/flow"] = torch.tensor(flow_for(clip.motion), dtype=torch.float32)
        if progress is not None:
            progress(1)
    if not tensors:
        raise DatasetError(f"{data} holds no clips")
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    save_file(tensors, str(tmp), metadata={"clips": str(len(tensors) // len(FIELDS))})
    os.replace(tmp, out)
    return len(tensors) // len(FIELDS)


def read_inputs(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    """``{key: {"latents": ..., "text": ..., "image": ..., "flow": ...}}`` from a file ``write_inputs`` wrote."""
    clips: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            key, _, field = name.rpartition("/")
            clips.setdefault(key, {})[field] = f.get_tensor(name)
    return clips
