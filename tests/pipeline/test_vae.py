"""The CogVideoX VAE: sizes, and decoding latents into frames the way the release does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLCogVideoX

from worker.pipeline.config import VAEConfig, tiny
from worker.pipeline.vae import build_vae, conv3d_by_frames, decode_latents

CFG = tiny()


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLCogVideoX:
    torch.manual_seed(0)
    return build_vae(CFG.vae).eval()


@pytest.fixture(scope="module")
def latents() -> torch.Tensor:
    # (B, F, C, h, w), the sampler's layout
    g = torch.Generator().manual_seed(1)
    return torch.randn(1, CFG.latent_frames, CFG.vae.latent_channels, CFG.latent_height, CFG.latent_width, generator=g)


@pytest.fixture(scope="module")
def frames(vae: AutoencoderKLCogVideoX, latents: torch.Tensor) -> np.ndarray:
    return decode_latents(vae, latents, CFG.vae.scaling_factor)


def test_five_latent_frames_decode_to_17_frames_of_64x96(latents: torch.Tensor, frames: np.ndarray) -> None:
    assert latents.shape == (1, 5, 4, 8, 12)
    assert frames.shape == (1, 17, 64, 96, 3)
    assert frames.dtype == np.uint8


def test_decoding_chunks_latent_frames_0_to_3_then_3_to_5_with_the_cache(
    vae: AutoencoderKLCogVideoX, latents: torch.Tensor, frames: np.ndarray
) -> None:
    with torch.no_grad():
        z = (latents / CFG.vae.scaling_factor).permute(0, 2, 1, 3, 4)  # (B, C, F, h, w)
        first, cache = vae.decoder(z[:, :, 0:3])
        second, _ = vae.decoder(z[:, :, 3:5], conv_cache=cache)
        video = torch.cat([first, second], dim=2)  # (B, 3, 9 + 8, H, W)
    expected = (((video + 1) / 2).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).numpy()
    np.testing.assert_array_equal(frames, expected)


def test_scaling_factor_divides_the_latents(
    vae: AutoencoderKLCogVideoX, latents: torch.Tensor, frames: np.ndarray
) -> None:
    doubled = decode_latents(vae, latents * 2.0, CFG.vae.scaling_factor * 2.0)  # exact: powers of two
    np.testing.assert_array_equal(doubled, frames)


def test_latents_with_the_wrong_channel_count_are_rejected(vae: AutoencoderKLCogVideoX) -> None:
    with pytest.raises(ValueError, match="channels"):
        decode_latents(vae, torch.zeros(1, 5, 3, 8, 12), 1.0)


def test_full_size_vae_has_about_0_216_billion_parameters() -> None:
    with torch.device("meta"):
        vae = build_vae(VAEConfig())
    assert sum(p.numel() for p in vae.parameters()) == 215_583_907
    assert vae.config.temporal_compression_ratio == 4
    assert vae.config.scaling_factor == pytest.approx(1.15258426)


def test_on_the_cpu_each_3d_convolution_runs_as_2d_ones_and_decodes_the_same_frames(
    latents: torch.Tensor, frames: np.ndarray
) -> None:
    torch.manual_seed(0)
    by_frames = build_vae(CFG.vae).eval()  # the same seeded weights as the fixture's
    changed = conv3d_by_frames(by_frames)
    convs = sum(isinstance(m, torch.nn.Conv3d) for m in by_frames.modules())
    again = decode_latents(by_frames, latents, CFG.vae.scaling_factor)
    assert changed == convs > 0
    assert np.abs(again.astype(int) - frames.astype(int)).max() <= 1  # float rounding of another summation order


def test_a_3d_convolution_by_frames_equals_torch_s_with_stride_and_padding_in_space() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(6, 5, (3, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
    x = torch.randn(2, 6, 7, 10, 12)
    expected = conv(x)
    assert conv3d_by_frames(conv) == 1
    assert torch.allclose(conv(x), expected, atol=1e-5)


def test_in_bf16_a_3d_convolution_by_frames_rounds_about_as_torch_s_own_does() -> None:
    """Each tap's 2D output is rounded to bf16 before the float32 sum (measured: 1.17x Conv3d's own error)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(16, 16, 3, padding=(0, 1, 1))
    x = torch.randn(1, 16, 5, 12, 16)
    exact = conv(x)
    native = conv.to(torch.bfloat16)(x.bfloat16()).float()
    conv3d_by_frames(conv)
    ours = conv(x.bfloat16()).float()
    assert (ours - exact).abs().mean() <= 1.5 * (native - exact).abs().mean()
