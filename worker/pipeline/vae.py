"""The CogVideoX 3D causal VAE (decoder side) and the release's way of turning latents into pixels.

diffusers' ``AutoencoderKLCogVideoX`` is this VAE (its conversion script reads the release's ``3d-vae.pt`` layout),
so it is built from the config rather than re-implemented.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLCogVideoX
from torch import nn

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


def conv3d_by_frames(vae: nn.Module) -> int:
    """Run the VAE's 3D convolutions as 2D ones, one per temporal tap; for the CPU. Returns how many it changed.

    PyTorch's CPU build runs Conv3d by its im2col fallback (``slow_conv3d``) where Conv2d goes to oneDNN: 82% of the
    toy model's VAE decode was slow_conv3d. Tap k of a (kt, kh, kw) kernel is a 2D convolution of the frames
    t + k by the kernel's slice k, and the taps summed are the 3D convolution, up to float rounding of another
    summation order (about 1e-6). Weights and the state dict are untouched; a GPU keeps cuDNN's Conv3d.
    """
    changed = 0
    for conv in vae.modules():
        if (
            isinstance(conv, nn.Conv3d)
            and conv.groups == 1
            and conv.padding_mode == "zeros"
            and (conv.stride[0], conv.dilation[0], conv.padding[0]) == (1, 1, 0)  # the causal pad is done before
        ):
            conv._conv_forward = functools.partial(_conv3d_by_frames, conv)  # what nn.Conv3d.forward calls
            changed += 1
    return changed


def _conv3d_by_frames(
    conv: nn.Conv3d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    batch, channels, frames, height, width = x.shape  # (B, C, T, H, W)
    taps = weight.shape[2]
    out_frames = frames - taps + 1
    # Channels last (oneDNN's own layout, 1.5-2.4x faster for these convolutions): one copy in, and each tap's
    # frames are then a view of it.
    x = x.permute(0, 2, 3, 4, 1).contiguous()  # (B, T, H, W, C)
    out: torch.Tensor | None = None
    for k in range(taps):
        window = x[:, k : k + out_frames].reshape(batch * out_frames, height, width, channels).permute(0, 3, 1, 2)
        kernel = weight[:, :, k].contiguous(memory_format=torch.channels_last)  # (O, C, kh, kw)
        y = F.conv2d(window, kernel, bias if k == 0 else None, conv.stride[1:], conv.padding[1:], conv.dilation[1:])
        # (B*T', O, H', W'), channels last; the taps summed in float32 (in bf16, each tap is rounded first: 1.17x
        # Conv3d's own rounding error, tests/pipeline/test_vae.py)
        out = y.float() if out is None else out.add_(y)
    assert out is not None
    out = out.permute(0, 2, 3, 1).reshape(batch, out_frames, *out.shape[2:], out.shape[1])  # (B, T', H', W', O)
    return out.permute(0, 4, 1, 2, 3).to(x.dtype, memory_format=torch.contiguous_format)  # (B, O, T', H', W')


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
