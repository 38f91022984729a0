"""Loading CogVideoX's ``3d-vae.pt`` (SAT naming) into diffusers' VAE: exact weights, sizes, clear errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLCogVideoX

from tests.checkpoints.release_sat import randomize_on_grid_, vae_sat_state, write_release_vae
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.vae import convert_vae_state, load_vae, vae_config_from_state
from worker.pipeline.config import tiny
from worker.pipeline.vae import build_vae

# The tiny VAE with level widths that differ, so the 1x1x1 shortcut convs exist and the up-level order matters.
CFG = replace(tiny().vae, block_out_channels=(8, 16, 16, 24))


@pytest.fixture(scope="module")
def known() -> AutoencoderKLCogVideoX:
    return randomize_on_grid_(build_vae(CFG), seed=5).eval()


@pytest.fixture(scope="module")
def vae_file(known: AutoencoderKLCogVideoX, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_release_vae(known, tmp_path_factory.mktemp("vae") / "3d-vae.pt")


@pytest.fixture(scope="module")
def sat_state(known: AutoencoderKLCogVideoX) -> dict[str, torch.Tensor]:
    return vae_sat_state(known)


def _save(state: dict[str, torch.Tensor], tmp_path: Path) -> Path:
    file = tmp_path / "3d-vae.pt"
    torch.save({"state_dict": state}, file)
    return file


@torch.no_grad()
def test_loading_reproduces_the_known_vae_exactly(known: AutoencoderKLCogVideoX, vae_file: Path) -> None:
    loaded = load_vae(vae_file, dtype=torch.float32, defaults=CFG)

    ours, theirs = loaded.state_dict(), known.state_dict()
    assert ours.keys() == theirs.keys()
    assert not [k for k in ours if not torch.equal(ours[k], theirs[k])]  # encoder included
    z = torch.randn(1, CFG.latent_channels, 3, 2, 3, generator=torch.Generator().manual_seed(2))  # (B, C, F, h, w)
    assert torch.equal(loaded.decode(z).sample, known.decode(z).sample)


def test_sizes_are_read_from_the_file(sat_state: dict[str, torch.Tensor]) -> None:
    # Group count, scaling factor and temporal compression are not in the weights: they come from the defaults.
    assert vae_config_from_state(sat_state, defaults=replace(CFG, block_out_channels=(1,), layers_per_block=9)) == CFG
    assert not any(k.startswith("loss") for k in convert_vae_state(sat_state, defaults=CFG))


def test_a_missing_tensor_names_the_file_the_key_and_its_shape(
    sat_state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    key = "decoder.up.0.block.0.nin_shortcut.weight"  # level 0 (16 -> 8 channels) is diffusers' up_blocks.3
    file = _save({k: v for k, v in sat_state.items() if k != key}, tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_vae(file, dtype=torch.float32, defaults=CFG)
    assert err.value.path == file
    assert f"{key} [8, 16, 1, 1, 1]" in str(err.value)


def test_a_wrong_shape_names_the_key_found_and_expected(sat_state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    key = "decoder.conv_out.conv.bias"
    file = _save({**sat_state, key: torch.zeros(4)}, tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_vae(file, dtype=torch.float32, defaults=CFG)
    assert err.value.path == file
    assert f"{key} has shape [4], expected [3]" in str(err.value)


def test_a_truncated_file_names_the_file(vae_file: Path, tmp_path: Path) -> None:
    file = tmp_path / "3d-vae.pt"
    file.write_bytes(vae_file.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        load_vae(file, dtype=torch.float32, defaults=CFG)
    assert err.value.path == file


def test_a_file_without_state_dict_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "3d-vae.pt"
    torch.save({"module": {}}, file)
    with pytest.raises(CheckpointError, match="state_dict") as err:
        load_vae(file, dtype=torch.float32)
    assert err.value.path == file
