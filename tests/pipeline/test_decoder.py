"""The AnimeGamer decoder: shapes, what conditions it, and the published size."""

from __future__ import annotations

import pytest
import torch

from worker.pipeline.config import full, tiny
from worker.pipeline.decoder import AnimeGamerDecoder

CFG = tiny()
B = 2


@pytest.fixture(scope="module")
def decoder() -> AnimeGamerDecoder:
    torch.manual_seed(0)
    return AnimeGamerDecoder.from_pipeline_config(CFG.decoder).eval()


def _inputs(decoder: AnimeGamerDecoder, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (B, CFG.latent_frames, CFG.decoder.latent_channels, CFG.latent_height, CFG.latent_width)
    return {
        "latents": torch.randn(shape, generator=g),
        "timestep": torch.tensor([999, 19]),
        "condition": torch.randn(B, CFG.num_query_tokens, decoder.hidden_size, generator=g),
        "flow": torch.tensor([2.5, 2.5]),
    }


@torch.no_grad()
def test_output_has_the_shape_of_the_latents(decoder: AnimeGamerDecoder) -> None:
    inputs = _inputs(decoder)
    out = decoder(**inputs)
    assert out.shape == inputs["latents"].shape == (B, 5, 4, 8, 12)
    assert torch.isfinite(out).all()


@torch.no_grad()
def test_motion_scope_changes_the_prediction(decoder: AnimeGamerDecoder) -> None:
    inputs = _inputs(decoder)
    slow = decoder(**inputs)
    fast = decoder(**{**inputs, "flow": torch.tensor([40.0, 40.0])})
    assert not torch.allclose(slow, fast)


@torch.no_grad()
def test_condition_tokens_change_the_prediction(decoder: AnimeGamerDecoder) -> None:
    inputs = _inputs(decoder)
    conditioned = decoder(**inputs)
    unconditioned = decoder(**{**inputs, "condition": decoder.unconditional_tokens(B)})
    assert not torch.allclose(conditioned, unconditioned)


@torch.no_grad()
def test_batch_items_are_independent(decoder: AnimeGamerDecoder) -> None:
    inputs = _inputs(decoder)
    together = decoder(**inputs)
    alone = decoder(**{k: v[1:] for k, v in inputs.items()})
    torch.testing.assert_close(together[1:], alone, rtol=1e-4, atol=1e-5)


def test_unconditional_tokens_are_a_deterministic_constant(decoder: AnimeGamerDecoder) -> None:
    tokens = decoder.unconditional_tokens(3)
    assert tokens.shape == (3, CFG.num_query_tokens, decoder.hidden_size)
    torch.testing.assert_close(tokens, decoder.unconditional_tokens(3), rtol=0, atol=0)
    torch.testing.assert_close(tokens[0], tokens[2], rtol=0, atol=0)
    # the text slots are one repeated row, as are the image slots: both come from zero inputs
    n_text, n_ip = CFG.decoder.num_text_tokens, CFG.decoder.num_ip_tokens
    assert torch.equal(tokens[0, :n_text], tokens[0, :1].expand(n_text, -1))
    assert torch.equal(tokens[0, n_text:], tokens[0, n_text : n_text + 1].expand(n_ip, -1))


@torch.no_grad()
def test_latent_sides_not_divisible_by_the_patch_are_rejected(decoder: AnimeGamerDecoder) -> None:
    inputs = _inputs(decoder)
    inputs["latents"] = inputs["latents"][..., :11]
    with pytest.raises(ValueError, match="divisible by patch_size"):
        decoder(**inputs)


@torch.no_grad()
def test_condition_of_the_wrong_width_is_rejected(decoder: AnimeGamerDecoder) -> None:
    inputs = _inputs(decoder)
    inputs["condition"] = torch.zeros(B, CFG.num_query_tokens, CFG.mllm.hidden_size * 2)
    with pytest.raises(ValueError, match="condition width"):
        decoder(**inputs)


def test_config_is_registered_for_save_and_load() -> None:
    decoder = AnimeGamerDecoder.from_pipeline_config(CFG.decoder)
    assert decoder.config.num_layers == CFG.decoder.num_layers
    assert decoder.config.spatial_interpolation_scale == 1.875
    assert decoder.hidden_size == CFG.decoder.hidden_size


def test_full_size_has_about_1_7_billion_parameters() -> None:
    with torch.device("meta"):
        decoder = AnimeGamerDecoder.from_pipeline_config(full().decoder)
    count = sum(p.numel() for p in decoder.parameters())
    # CogVideoX-2B (1.694 B) minus its T5 projection, plus the text/image MLPs and the motion-scope MLP
    assert count == 1_703_890_880
    assert len(decoder.transformer_blocks) == 30
    assert decoder.flow_embedding.linear_1.weight.shape == (512, 1920)
    assert decoder.flow_embedding.linear_2.weight.shape == (512, 512)
