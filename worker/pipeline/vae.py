"""The CogVideoX 3D causal VAE (decoder side) and the release's way of turning latents into pixels.

diffusers' ``AutoencoderKLCogVideoX`` is this VAE (its conversion script reads the release's ``3d-vae.pt`` layout),
so it is built from the config rather than re-implemented.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from diffusers import AutoencoderKLCogVideoX

from worker.pipeline.config import VAEConfig

logger = logging.getLogger(__name__)


def build_vae(config: VAEConfig) -> AutoencoderKLCogVideoX:
    """A randomly initialised CogVideoX VAE of the config's size (load weights into it separately)."""
    num_blocks = len(config.block_out_channels)
    if num_blocks != 4:
        # The CogVideoX up blocks compress time twice and space three times; other depths break the 4x / 8x sizes.
        raise ValueError(f"the CogVideoX VAE has 4 blocks, got block_out_channels={config.block_out_channels}")
    if any(c % config.norm_num_groups for c in config.block_out_channels):
        raise ValueError(
            f"every block width must be a multiple of norm_num_groups={config.norm_num_groups}, "
            f"got {config.block_out_channels}"
        )
    return AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * num_blocks,
        up_block_types=("CogVideoXUpBlock3D",) * num_blocks,
        block_out_channels=tuple(config.block_out_channels),
        latent_channels=config.latent_channels,
        layers_per_block=config.layers_per_block,
        norm_num_groups=config.norm_num_groups,
        temporal_compression_ratio=config.temporal_compression,
        scaling_factor=config.scaling_factor,
    )


@torch.no_grad()
def decode_latents(
    vae: AutoencoderKLCogVideoX, latents: torch.Tensor, scaling_factor: float | None = None
) -> np.ndarray:
    """Decode sampler output `(B, F, C, h, w)` into uint8 frames `(B, T, H, W, 3)`, T = 4 (F - 1) + 1.

    The release decodes latent frames [0:3] and then [3:5], carrying the causal-conv cache across. diffusers'
    ``AutoencoderKLCogVideoX._decode`` does exactly this for 5 latent frames: with ``num_latent_frames_batch_size``
    2 its chunks are [0 : 2 + 5 % 2] = [0:3] and then [3:5], passing ``conv_cache`` from one to the next. So this
    relies on it, with spatial tiling off (the default), which would otherwise change the result.
    """
    if latents.ndim != 5:
        raise ValueError(f"latents must be (batch, frames, channels, height, width), got shape {tuple(latents.shape)}")
    if latents.shape[2] != vae.config.latent_channels:
        raise ValueError(f"latents have {latents.shape[2]} channels; the VAE expects {vae.config.latent_channels}")
    if scaling_factor is None:
        scaling_factor = vae.config.scaling_factor

    weight = next(vae.decoder.parameters())
    # The sampler may run in another precision than the VAE; decode in the VAE's own dtype and device.
    z = latents.to(device=weight.device, dtype=weight.dtype) / scaling_factor  # (B, F, C, h, w)
    z = z.permute(0, 2, 1, 3, 4)  # (B, C, F, h, w), the VAE's layout
    video = vae.decode(z).sample  # (B, 3, T, H, W) in [-1, 1]

    video = ((video.float() + 1.0) / 2.0).clamp(0.0, 1.0)
    video = video.permute(0, 2, 3, 4, 1)  # (B, T, H, W, 3)
    return (video * 255.0).round().to(torch.uint8).cpu().numpy()
