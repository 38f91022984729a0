"""The frozen T5 and OpenCLIP encoders come out of a release-layout decoder file as the release holds them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.checkpoints.release_sat import frozen_encoder_state, save_release_decoder, tiny_frozen_encoders
from tests.checkpoints.release_tree import write_tiny_release
from training.frozen_encoders import T5_PREFIX, T5_TOKENIZER_DIR, TEXT_TOKENS, load_frozen_encoders
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.layout import CheckpointLayout


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_release(tmp_path_factory.mktemp("tree"), ("Qiqi",))


def _load(release):
    layout = CheckpointLayout(release.root, "Qiqi")
    return load_frozen_encoders(layout.decoder_dir, release.root / T5_TOKENIZER_DIR)


@torch.no_grad()
def test_text_features_are_the_written_t5_over_30_padded_tokens(tree) -> None:
    encoders = _load(tree)
    t5, _ = tiny_frozen_encoders(tree.config.decoder.text_embed_dim, tree.config.decoder.ip_embed_dim)
    texts = ["Character: Mika; Motion: quickly run; Background: day beach.", "Character: Mika; Motion: wave."]
    ids = encoders.tokenizer(texts, max_length=TEXT_TOKENS, padding="max_length", truncation=True, return_tensors="pt")
    features = encoders.text(texts)
    assert features.shape == (2, TEXT_TOKENS, tree.config.decoder.text_embed_dim)
    torch.testing.assert_close(features, t5(input_ids=ids.input_ids).last_hidden_state)


@torch.no_grad()
def test_image_features_are_196_patch_tokens_of_the_penultimate_block(tree) -> None:
    encoders = _load(tree)
    _, vision = tiny_frozen_encoders(tree.config.decoder.text_embed_dim, tree.config.decoder.ip_embed_dim)
    frames = torch.randint(0, 256, (2, 64, 96, 3), dtype=torch.uint8)
    features = encoders.image(frames)
    assert features.shape == (2, 196, tree.config.decoder.ip_embed_dim)
    torch.testing.assert_close(features, vision(frames.permute(0, 3, 1, 2).float() / 255))
    with torch.no_grad():  # the last block is not used: changing it changes nothing
        encoders.vision.transformer.resblocks[-1].mlp.c_fc.weight.add_(1.0)
    torch.testing.assert_close(encoders.image(frames), features)
    assert not torch.allclose(encoders.image(frames.flip(2)), features)


def test_a_decoder_file_without_t5_names_the_file_and_the_prefix(tmp_path: Path, tree) -> None:
    state = frozen_encoder_state(32, 16)
    state = {k: v for k, v in state.items() if not k.startswith(T5_PREFIX)}
    directory = tmp_path / "VDM_Decoder-Mika"
    file = save_release_decoder(state, directory, step=3)
    with pytest.raises(CheckpointError, match=rf"{file}.*holds no {T5_PREFIX}\* tensors"):
        load_frozen_encoders(directory, tree.root / T5_TOKENIZER_DIR)


def test_a_missing_tokenizer_directory_is_named(tmp_path: Path, tree) -> None:
    layout = CheckpointLayout(tree.root, "Qiqi")
    with pytest.raises(CheckpointError, match=r"nowhere.*spiece\.model"):
        load_frozen_encoders(layout.decoder_dir, tmp_path / "nowhere")
