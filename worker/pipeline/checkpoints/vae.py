"""Load the release's CogVideoX VAE file (``checkpoints/vae/3d-vae.pt``) into diffusers' ``AutoencoderKLCogVideoX``.

The file is ``{'state_dict': ...}`` in the SAT/sgm naming of the release's ``VDM_Decoder/vae_modules/cp_enc_dec.py``
(the layout diffusers' ``scripts/convert_cogvideox_to_diffusers.py`` reads). SAT name -> diffusers name:

    {encoder,decoder}.conv_in / conv_out / norm_out     unchanged
    encoder.down.{i}.block.{j}                          encoder.down_blocks.{i}.resnets.{j}
    encoder.down.{i}.downsample                         encoder.down_blocks.{i}.downsamplers.0
    {encoder,decoder}.mid.block_{1,2}                   {encoder,decoder}.mid_block.resnets.{0,1}
    decoder.up.{i}.block.{j}                            decoder.up_blocks.{n-1-i}.resnets.{j}
    decoder.up.{i}.upsample                             decoder.up_blocks.{n-1-i}.upsamplers.0
    ....nin_shortcut (1x1x1 Conv3d)                     ....conv_shortcut

SAT builds ``decoder.up`` with ``insert(0, ...)``, so ``up[i]`` is resolution level i (0 = full size, run last);
diffusers numbers its up blocks in the order they run, hence n-1-i.

The encoder is loaded too, although a turn only decodes: the file ships it, the module has one, and a strict
load of both halves is a stronger check that this is the right file than half of one (and leaves no randomly
initialised encoder behind for anyone who calls ``encode``). Its cost is about 0.1 GB.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
from diffusers import AutoencoderKLCogVideoX

from worker.pipeline.checkpoints.decoder import check_sources
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.files import RELEASE_EVERY, hand_back, load_torch_file
from worker.pipeline.config import VAEConfig
from worker.pipeline.vae import build_vae

logger = logging.getLogger(__name__)

# Tensors of the file that inference does not use: skipped by rule.
SKIPPED_PREFIXES: dict[str, str] = {
    "loss.": "the training loss (discriminator, LPIPS); diffusers' converter drops it too",
}

_UP_LEVEL = re.compile(r"decoder\.up\.(\d+)\.block\.(\d+)\.")

# diffusers -> SAT, applied in order to a diffusers key (the level swap for up blocks is done in _sat_key).
_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\."), r"encoder.down.\1.block.\2."),
    (re.compile(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\."), r"encoder.down.\1.downsample."),
    (re.compile(r"^(encoder|decoder)\.mid_block\.resnets\.0\."), r"\1.mid.block_1."),
    (re.compile(r"^(encoder|decoder)\.mid_block\.resnets\.1\."), r"\1.mid.block_2."),
    (re.compile(r"\.conv_shortcut\."), ".nin_shortcut."),
)
_UP_BLOCK = re.compile(r"^decoder\.up_blocks\.(\d+)\.(resnets\.(\d+)|upsamplers\.0)\.")


def skip_reason(key: str) -> str | None:
    """Why a tensor of the VAE file is not loaded, or None when the VAE needs it."""
    for prefix, reason in SKIPPED_PREFIXES.items():
        if key.startswith(prefix):
            return reason
    return None


def _sat_key(key: str, num_levels: int) -> str:
    """The SAT name of one of diffusers' VAE keys."""
    up = _UP_BLOCK.match(key)
    if up:
        level = num_levels - 1 - int(up.group(1))
        inner = f"block.{up.group(3)}." if up.group(3) is not None else "upsample."
        key = f"decoder.up.{level}.{inner}{key[up.end() :]}"
    for pattern, template in _RENAMES:
        key = pattern.sub(template, key)
    return key


def vae_config_from_state(
    state: Mapping[str, torch.Tensor], path: Path | str = "<state dict>", *, defaults: VAEConfig | None = None
) -> VAEConfig:
    """The VAE's sizes, read from the decoder half of a SAT VAE state dict.

    Scaling factor and temporal compression leave no trace in the weights: they come from ``defaults``
    (the release's 1.15258426 and 4 when None). Nor does the GroupNorm group count; without ``defaults``
    it is the largest count up to 32 that divides every width (the release's 32; 8 for the tiny VAE),
    the rule our own configs follow so that a tiny checkpoint loads without a side file.
    """
    blocks: dict[int, set[int]] = {}
    for key in state:
        if m := _UP_LEVEL.match(key):
            blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    if not blocks:
        raise CheckpointError(path, "has no decoder up blocks", "keys decoder.up.<level>.block.<j>.* (SAT VAE layout)")
    widths = []
    for level in range(max(blocks) + 1):
        key = f"decoder.up.{level}.block.0.conv1.conv.weight"
        tensor = state.get(key)
        if tensor is None or tensor.ndim != 5:
            found = "missing" if tensor is None else f"shape {list(tensor.shape)}"
            raise CheckpointError(path, f"tensor {key} is {found}", "a 5-d Conv3d weight giving the level's width")
        widths.append(int(tensor.shape[0]))
    conv_in = state.get("decoder.conv_in.conv.weight")
    if conv_in is None or conv_in.ndim != 5:
        found = "missing" if conv_in is None else f"shape {list(conv_in.shape)}"
        raise CheckpointError(path, f"tensor decoder.conv_in.conv.weight is {found}", "a 5-d Conv3d weight")
    groups = defaults.norm_num_groups if defaults else max(g for g in range(1, 33) if all(w % g == 0 for w in widths))
    return replace(
        defaults or VAEConfig(),
        norm_num_groups=groups,
        block_out_channels=tuple(widths),
        latent_channels=int(conv_in.shape[1]),
        layers_per_block=len(blocks[0]) - 1,  # the decoder has one resnet more per level than the encoder
    )


def _build(cfg: VAEConfig, path: Path | str) -> AutoencoderKLCogVideoX:
    """The VAE on the meta device: shapes only, no init cost."""
    try:
        with torch.device("meta"):
            return build_vae(cfg)
    except ValueError as exc:
        raise CheckpointError(path, f"describes a VAE we cannot build ({exc})", "a CogVideoX VAE") from exc


def _convert(
    state: Mapping[str, torch.Tensor],
    path: Path | str,
    dtype: torch.dtype | None,
    defaults: VAEConfig | None,
    device: torch.device,
) -> tuple[VAEConfig, dict[str, torch.Tensor]]:
    cfg = vae_config_from_state(state, path, defaults=defaults)
    targets = {key: tuple(t.shape) for key, t in _build(cfg, path).state_dict().items()}
    sources = {_sat_key(key, len(cfg.block_out_channels)): key for key in targets}
    layout = f"SAT CogVideoX VAE layout (widths {list(cfg.block_out_channels)}, read from this file)"
    check_sources(state, {src: targets[dst] for src, dst in sources.items()}, path, skip_reason, layout)
    # Copies, made on the device (the meta device reads nothing): nothing returned may keep the memory-mapped file
    # alive or change with it. The file's pages read so far go back as the conversion goes.
    converted: dict[str, torch.Tensor] = {}
    read = 0
    for src, dst in sources.items():
        converted[dst] = state[src].to(device=device, dtype=dtype or state[src].dtype, copy=True)
        read += state[src].nbytes
        if read >= RELEASE_EVERY:
            hand_back(path)
            read = 0
    hand_back(path)
    logger.info("%s: %d VAE tensors converted, %d skipped by rule", path, len(converted), len(state) - len(converted))
    return cfg, converted


def convert_vae_state(
    state: Mapping[str, torch.Tensor],
    path: Path | str = "<state dict>",
    *,
    dtype: torch.dtype | None = None,
    defaults: VAEConfig | None = None,
) -> dict[str, torch.Tensor]:
    """Map a SAT VAE state dict (encoder and decoder) to ``AutoencoderKLCogVideoX``'s.

    ``loss.*`` is skipped by rule; anything else missing, unexpected or wrongly shaped is a :class:`CheckpointError`
    naming ``path`` and the keys. ``dtype`` None keeps the file's precision.
    """
    return _convert(state, path, dtype, defaults, torch.device("cpu"))[1]


def load_vae(
    path: Path | str,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    defaults: VAEConfig | None = None,
) -> AutoencoderKLCogVideoX:
    """Build the VAE from ``3d-vae.pt``, checked and converted in full before the module exists.

    Tensors are converted straight onto ``device`` (on ``meta``, shapes only: nothing is read).
    """
    file = Path(path)
    checkpoint = load_torch_file(file)
    state = checkpoint.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(file, "has no 'state_dict' of tensors", "{'state_dict': ...} as CogVideoX's 3d-vae.pt")
    cfg, converted = _convert(state, file, dtype, defaults, torch.device(device))
    del checkpoint, state  # drop the file mapping before the model is moved

    vae = _build(cfg, file)
    vae.load_state_dict(converted, strict=True, assign=True)
    # Filled means taken from the file (on the meta device, a conversion for shapes only is meta too).
    tensors = [*vae.named_parameters(), *vae.named_buffers()]
    on_meta = [name for name, t in tensors if t.is_meta and name not in converted]
    if on_meta:  # a module grew a tensor the mapping does not fill: our bug, not the file's
        raise RuntimeError(f"VAE tensors left unloaded: {on_meta}")
    return vae.to(device).eval().requires_grad_(False)
