"""The AnimeGamer decoder: shapes, what conditions it, and the published size."""

from __future__ import annotations

import pytest
import torch

from worker.pipeline.config import full, tiny
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.step_cache import StepCache

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


def _layer_norm_by_hand(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    centred = x - x.mean(dim=-1, keepdim=True)
    variance = centred.pow(2).mean(dim=-1, keepdim=True)  # biased, as LayerNorm's
    return centred / torch.sqrt(variance + eps) * weight.double() + bias.double()


# The release's eps per norm (decoder.py cites where each comes from): SAT's blocks and final norm take its
# layernorm_epsilon of 1e-5; the output adaLN's own norm and the per-head q/k norms are 1e-6; the condition
# branches' norms are plain nn.LayerNorm (1e-5).
RELEASE_EPS = [
    ("transformer_blocks.0.norm1.norm", 1e-5),
    ("transformer_blocks.1.norm2.norm", 1e-5),
    ("norm_final", 1e-5),
    ("norm_out.norm", 1e-6),
    ("transformer_blocks.0.attn1.norm_q", 1e-6),
    ("transformer_blocks.1.attn1.norm_k", 1e-6),
    ("text_norm", 1e-5),
    ("ip_norm", 1e-5),
]


@pytest.mark.parametrize(("name", "eps"), RELEASE_EPS)
@torch.no_grad()
def test_each_layer_norm_computes_with_the_releases_eps(decoder: AnimeGamerDecoder, name: str, eps: float) -> None:
    norm = decoder.get_submodule(name)
    width = norm.normalized_shape[0]
    g = torch.Generator().manual_seed(3)
    # Activations of variance ~1e-6, where eps 1e-5 and 1e-6 give outputs a factor ~2.3 apart
    x = 1e-3 * torch.randn(4, 7, width, generator=g)
    other = 1e-6 if eps == 1e-5 else 1e-5
    by_hand = _layer_norm_by_hand(x, norm.weight, norm.bias, eps)
    assert not torch.allclose(_layer_norm_by_hand(x, norm.weight, norm.bias, other), by_hand, rtol=0.1)
    torch.testing.assert_close(norm(x).double(), by_hand, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_a_blocks_adaptive_norm_normalises_at_eps_1e_5(decoder: AnimeGamerDecoder) -> None:
    norm1 = decoder.transformer_blocks[0].norm1  # LayerNormZero: norm, then (1 + scale) and shift from the time
    g = torch.Generator().manual_seed(4)
    video, cond = 1e-3 * torch.randn(B, 9, decoder.hidden_size, generator=g), torch.randn(B, 5, decoder.hidden_size)
    temb = torch.randn(B, CFG.decoder.time_embed_dim, generator=g)
    out, _, _, _ = norm1(video, cond, temb)
    shift, scale = norm1.linear(torch.nn.functional.silu(temb)).chunk(6, dim=1)[:2]
    expected = _layer_norm_by_hand(video, norm1.norm.weight, norm1.norm.bias, 1e-5) * (1 + scale.double())[:, None]
    torch.testing.assert_close(out.double(), expected + shift.double()[:, None], rtol=1e-4, atol=1e-5)


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


@torch.no_grad()
def test_a_step_cache_reuses_the_later_blocks_when_the_first_block_s_residual_barely_changed(
    decoder: AnimeGamerDecoder,
) -> None:
    inputs = _inputs(decoder)
    cache = StepCache(threshold=0.05)
    decoder(**inputs, cache=cache)
    nudged = {**inputs, "latents": inputs["latents"] * 1.0001}
    reused = decoder(**nudged, cache=cache)
    assert (cache.computed, cache.reused) == (1, 1)
    assert torch.allclose(reused, decoder(**nudged), atol=1e-2)


@torch.no_grad()
def test_a_reused_step_is_this_step_s_first_block_with_the_cached_rest_not_the_last_output(
    decoder: AnimeGamerDecoder,
) -> None:
    """With a threshold nothing fails, a step of quite other latents is reused: its output moves with its own
    first block (so it is not the cached output) but is not what every block would make of it."""
    first, other = _inputs(decoder), _inputs(decoder, seed=1)
    cache = StepCache(threshold=1e9)
    stale = decoder(**first, cache=cache)
    reused = decoder(**other, cache=cache)
    assert (cache.computed, cache.reused) == (1, 1)
    assert not torch.allclose(reused, stale, atol=1e-2)
    assert not torch.allclose(reused, decoder(**other), atol=1e-3)


@torch.no_grad()
def test_a_step_cache_runs_every_block_when_the_input_moved_or_the_batch_changed(decoder: AnimeGamerDecoder) -> None:
    inputs = _inputs(decoder)
    cache = StepCache(threshold=0.05)
    decoder(**inputs, cache=cache)
    decoder(**_inputs(decoder, seed=1), cache=cache)  # other latents: the first block's residual moves
    half = {name: value[:1] for name, value in inputs.items()}  # the conditional half alone after the pair
    decoder(**half, cache=cache)
    assert (cache.computed, cache.reused) == (3, 0)
