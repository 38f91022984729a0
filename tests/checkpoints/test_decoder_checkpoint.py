"""Loading the release's SAT decoder checkpoint: exact weights, sizes from the file, and clear errors for bad files."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from tests.checkpoints.release_sat import (
    DIT,
    decoder_sat_state,
    randomize_on_grid_,
    save_release_decoder,
    write_release_decoder,
)
from worker.pipeline.checkpoints.decoder import convert_decoder_state, decoder_config_from_state, load_decoder
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.config import tiny
from worker.pipeline.decoder import AnimeGamerDecoder

CFG = tiny().decoder


@pytest.fixture(scope="module")
def known() -> AnimeGamerDecoder:
    """A tiny decoder with known weights, every tensor different (norms too), on the grid the writer needs."""
    model = AnimeGamerDecoder.from_pipeline_config(CFG)
    return randomize_on_grid_(model, seed=3).eval()


@pytest.fixture(scope="module")
def release_dir(known: AnimeGamerDecoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("VDM_Decoder-Tiny")
    write_release_decoder(known, directory, step=1000)
    return directory


@pytest.fixture(scope="module")
def sat_state(known: AnimeGamerDecoder) -> dict[str, torch.Tensor]:
    return decoder_sat_state(known)


def _inputs(model: AnimeGamerDecoder) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "latents": torch.randn(2, 2, CFG.latent_channels, 4, 6, generator=g),  # (B, F, C, H, W)
        "timestep": torch.tensor([999, 19]),
        "condition": torch.randn(2, model.num_condition_tokens, model.hidden_size, generator=g),
        "flow": torch.tensor([2.5, 40.0]),
    }


def _save(state: dict[str, torch.Tensor], tmp_path: Path) -> Path:
    return save_release_decoder(state, tmp_path / "VDM_Decoder-Tiny", step=1000)


@torch.no_grad()
def test_loading_reproduces_the_known_decoder_exactly(known: AnimeGamerDecoder, release_dir: Path) -> None:
    loaded = load_decoder(release_dir, dtype=torch.float32)

    ours, theirs = loaded.state_dict(), known.state_dict()
    assert ours.keys() == theirs.keys()
    different = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not different  # the LoRA merge, the qkv split and the adaLN chunks all land exactly
    inputs = _inputs(known)
    assert torch.equal(loaded(**inputs), known(**inputs))
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())


def test_sizes_are_read_from_the_file(sat_state: dict[str, torch.Tensor], release_dir: Path) -> None:
    assert decoder_config_from_state(sat_state) == CFG
    loaded = load_decoder(release_dir / "1000" / "mp_rank_00_model_states.pt", dtype=torch.bfloat16)
    assert all(loaded.config[name] == value for name, value in asdict(CFG).items())
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_unused_submodels_and_position_tables_are_skipped_by_rule(sat_state: dict[str, torch.Tensor]) -> None:
    converted = convert_decoder_state(sat_state)
    assert not any(k.startswith(("conditioner", "first_stage_model", "clip_img_encoder")) for k in converted)
    assert not any("pos_emb" in k or "mix_layer_norm" in k or "matrix_" in k for k in converted)
    assert {"text_norm.weight", "transformer_blocks.1.attn1.to_v.weight"} <= converted.keys()


def test_a_missing_tensor_names_the_file_the_key_and_its_shape(
    sat_state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    key = DIT + "transformer.layers.1.attention.dense.matrix_B.0"
    file = _save({k: v for k, v in sat_state.items() if k != key}, tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_decoder(file.parent.parent, dtype=torch.float32)
    assert err.value.path == file
    assert key in str(err.value) and "[32, 64]" in str(err.value)


def test_a_wrong_shape_names_the_key_found_and_expected(sat_state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    key = DIT + "mixins.final_layer.linear.bias"
    file = _save({**sat_state, key: torch.zeros(17)}, tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_decoder(file, dtype=torch.float32)
    assert err.value.path == file
    assert f"{key} has shape [17], expected [16]" in str(err.value)


def test_an_unexpected_tensor_is_an_error(sat_state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    key = DIT + "mixins.patch_embed.mix_proj.weight"  # the release's branch for image widths other than 768
    file = _save({**sat_state, key: torch.zeros(226, 483)}, tmp_path)
    with pytest.raises(CheckpointError, match=r"unexpected tensor.*mix_proj") as err:
        load_decoder(file, dtype=torch.float32)
    assert err.value.path == file


def test_a_truncated_file_names_the_file(release_dir: Path, tmp_path: Path) -> None:
    data = (release_dir / "1000" / "mp_rank_00_model_states.pt").read_bytes()
    file = tmp_path / "1000" / "mp_rank_00_model_states.pt"
    file.parent.mkdir()
    file.write_bytes(data[: len(data) // 2])
    (tmp_path / "latest").write_text("1000\n")
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        load_decoder(tmp_path, dtype=torch.float32)
    assert err.value.path == file


def test_latest_pointing_nowhere_names_the_missing_file(release_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "latest").write_text("999")
    with pytest.raises(CheckpointError, match="latest") as err:
        load_decoder(tmp_path, dtype=torch.float32)
    assert err.value.path == tmp_path / "999" / "mp_rank_00_model_states.pt"

    with pytest.raises(CheckpointError) as err:
        load_decoder(tmp_path / "elsewhere", dtype=torch.float32)
    assert err.value.path == tmp_path / "elsewhere"


def test_pickled_objects_are_refused_not_run(sat_state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    file = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": sat_state, "args": argparse.Namespace(lr=1e-4)}, file)
    with pytest.raises(CheckpointError, match="not loaded for safety") as err:
        load_decoder(file, dtype=torch.float32)
    assert err.value.path == file
