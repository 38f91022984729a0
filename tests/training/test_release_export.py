"""A trained decoder written in the release's layout: the project's loader reads back the very module trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model

from training.character_decoder import DECODER_LORA
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


@pytest.fixture(scope="module")
def beside_qiqi(tmp_path_factory: pytest.TempPathFactory):
    """A tiny published tree with Qiqi, and Mika trained over the same Mistral base and exported beside her."""
    from safetensors.torch import load_file

    from tests.checkpoints.release_tree import write_tiny_release
    from training.character_phase_b import MLLM_LORA
    from worker.pipeline.mllm import AnimeGamerMLLM

    release = write_tiny_release(tmp_path_factory.mktemp("tree"), ("Qiqi",))
    torch.manual_seed(5)
    mika = AnimeGamerMLLM(release.config.mllm, release.mllm.llm.config.vocab_size, release.config.decoder.hidden_size)
    base = load_file(release.root / "Mistral-7B-Instruct-v0.1" / "model.safetensors")
    state = mika.llm.state_dict()
    for key, value in base.items():  # training starts from the shared base; the added rows are its own
        state[key][: value.shape[0]] = value
    mika.llm.load_state_dict(state)
    inject_adapter_in_model(MLLM_LORA, mika.llm)
    with torch.no_grad():
        for name, param in mika.named_parameters():
            if "lora_" in name or "norm" in name or "resampler" in name:
                param.add_(torch.randn_like(param) * 0.05)
    mika.eval()
    decoder = trained(seed=9)
    from training.release_export import export_character

    export_character(release.root, "Mika", mika, decoder, step=40)
    return release.root, mika, decoder


@torch.no_grad()
def test_a_character_exported_beside_the_published_ones_is_served_on_their_base(beside_qiqi) -> None:
    from worker.pipeline.checkpoints.load import Clip, load_release_pipelines

    root, mika, decoder = beside_qiqi
    pipes = load_release_pipelines(root, ("Qiqi", "Mika"), device="cpu", clip=Clip(17, 64, 96), num_steps=2)
    assert pipes["Mika"].mllm is pipes["Qiqi"].mllm  # one base for both
    ids = torch.tensor([[1, 5, 9, 33, 290]])
    hidden = torch.ones(1, 3, mika.llm.config.hidden_size)
    with pipes["Mika"].mllm_phase():
        logits = pipes["Mika"].mllm.llm(input_ids=ids).logits
        resampled = pipes["Mika"].mllm.output_resampler(hidden)
    torch.testing.assert_close(logits, mika.llm(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(resampled, mika.output_resampler(hidden))
    got = pipes["Mika"].decoder(**inputs(decoder))
    torch.testing.assert_close(got, decoder(**inputs(decoder)), rtol=1e-4, atol=1e-5)
    with pipes["Qiqi"].mllm_phase():  # and Qiqi is still herself
        assert (pipes["Qiqi"].mllm.llm(input_ids=ids).logits - logits).abs().max() > 1e-2


def test_checkpoints_check_accepts_the_exported_character(beside_qiqi, capsys) -> None:
    from animegamer.cli import main

    root, _, _ = beside_qiqi
    assert main(["checkpoints", "check", str(root), "--character", "Qiqi", "--character", "Mika"]) == 0
    assert "Mika" in capsys.readouterr().out
