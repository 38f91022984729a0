"""A trained decoder written in the release's layout: the project's loader reads back the very module trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model

from training.plan import DECODER_LORA
from training.release_export import ExportError, decoder_release_state, save_release_decoder
from worker.pipeline.checkpoints.decoder import load_decoder
from worker.pipeline.config import tiny
from worker.pipeline.decoder import AnimeGamerDecoder

CFG = tiny().decoder


def trained(config: LoraConfig = DECODER_LORA, seed: int = 0) -> AnimeGamerDecoder:
    """A tiny decoder as phase (a) leaves it: random weights, peft's LoRA with both matrices non-zero."""
    torch.manual_seed(seed)
    decoder = AnimeGamerDecoder.from_pipeline_config(CFG)
    inject_adapter_in_model(config, decoder)
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.2)
    return decoder.eval()


def inputs(decoder: AnimeGamerDecoder) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "latents": torch.randn(2, 2, CFG.latent_channels, 4, 6, generator=g),
        "timestep": torch.tensor([999, 19]),
        "condition": torch.randn(2, decoder.num_condition_tokens, decoder.hidden_size, generator=g),
        "flow": torch.tensor([2.5, 40.0]),
    }


@torch.no_grad()
@pytest.mark.parametrize("alpha", [1, 16], ids=["release-scale", "other-scale"])
def test_the_loader_reads_back_the_trained_decoder(tmp_path: Path, alpha: int) -> None:
    decoder = trained(LoraConfig(r=DECODER_LORA.r, lora_alpha=alpha, target_modules=DECODER_LORA.target_modules))
    file = save_release_decoder(decoder_release_state(decoder), tmp_path / "VDM_Decoder-Mika", step=300)
    loaded = load_decoder(tmp_path / "VDM_Decoder-Mika", dtype=torch.float32)
    assert file == tmp_path / "VDM_Decoder-Mika" / "300" / "mp_rank_00_model_states.pt"
    torch.testing.assert_close(loaded(**inputs(decoder)), decoder(**inputs(decoder)), rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_the_lora_is_kept_as_the_release_holds_it_not_merged(tmp_path: Path) -> None:
    decoder = trained()
    state = decoder_release_state(decoder)
    qkv = "model.diffusion_model.transformer.layers.0.attention.query_key_value"
    attn = decoder.transformer_blocks[0].attn1
    assert torch.equal(state[f"{qkv}.matrix_A.1"], attn.to_k.lora_A["default"].weight)
    assert state[f"{qkv}.original.weight"].shape == (3 * decoder.hidden_size, decoder.hidden_size)
    assert torch.equal(state[f"{qkv}.original.weight"][: decoder.hidden_size], attn.to_q.base_layer.weight)


def test_a_decoder_without_lora_is_refused_by_name() -> None:
    with pytest.raises(ExportError, match=r"layers\.0\.attention\.query_key_value: the decoder has no LoRA here"):
        decoder_release_state(AnimeGamerDecoder.from_pipeline_config(CFG))


def test_latest_names_the_newest_step_and_no_partial_file_is_left(tmp_path: Path) -> None:
    directory = tmp_path / "VDM_Decoder-Mika"
    save_release_decoder(decoder_release_state(trained()), directory, step=100)
    save_release_decoder(decoder_release_state(trained(seed=1)), directory, step=200)
    assert (directory / "latest").read_text() == "200"
    assert not list(directory.rglob("*.partial"))
