"""The MLLM loader against files written in the release's layout by peft itself (see release_mllm.py).

Loading must reproduce the known module exactly (to float32 merging rounding), read its sizes from
config.json, and refuse every damaged input with a CheckpointError naming the file and the key.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from game.contract import HistoryTurn
from game.state import StateDeltas
from tests.checkpoints.release_mllm import SKIPPABLE_EXTRAS, ReleaseFiles, write_release_mllm
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.mllm import load_mllm, mllm_config_from_dir
from worker.pipeline.config import tiny
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.prompt import build_prompt
from worker.pipeline.tokenizer import AnimeGamerTokenizer

NOW = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
EARLIER = "Character: Qiqi; Motion: slowly walk; Background: day forest."
PREFIX = "llm.base_model.model."
REPRESENTATION_DIM = tiny().decoder.hidden_size


@pytest.fixture(scope="module")
def tokenizer() -> AnimeGamerTokenizer:
    return AnimeGamerTokenizer.tiny()


@pytest.fixture(scope="module")
def known(tokenizer: AnimeGamerTokenizer) -> AnimeGamerMLLM:
    """Random weights, norms included (they start at one, which would hide a wrong norm copy)."""
    torch.manual_seed(7)
    model = AnimeGamerMLLM(tiny().mllm, tokenizer.vocab_size, REPRESENTATION_DIM).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(0.5 + torch.rand_like(param))
    return model


@pytest.fixture(scope="module")
def release(known: AnimeGamerMLLM, tmp_path_factory: pytest.TempPathFactory) -> ReleaseFiles:
    return write_release_mllm(known, tmp_path_factory.mktemp("release"))


def load(files: ReleaseFiles, mllm_file: Path | None = None, **kwargs: object) -> AnimeGamerMLLM:
    kwargs.setdefault("dtype", torch.float32)
    return load_mllm(
        files.mistral_dir,
        mllm_file or files.mllm_file,
        vocab_size=AnimeGamerTokenizer.tiny().vocab_size,
        representation_dim=REPRESENTATION_DIM,
        **kwargs,  # type: ignore[arg-type]
    )


def rewrite(files: ReleaseFiles, tmp_path: Path, edit: dict[str, torch.Tensor | None]) -> Path:
    """A copy of the MLLM file with tensors replaced (or removed, for None)."""
    state = torch.load(files.mllm_file, weights_only=True)
    for key, value in edit.items():
        assert key in state or value is not None, key
        if value is None:
            del state[key]
        else:
            state[key] = value
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path)
    return path


def test_release_file_uses_peft_key_names(release: ReleaseFiles) -> None:
    keys = set(torch.load(release.mllm_file, weights_only=True, mmap=True))
    for key in (
        f"{PREFIX}model.layers.0.self_attn.q_proj.lora_A.default.weight",
        f"{PREFIX}model.layers.1.mlp.down_proj.lora_B.default.weight",
        f"{PREFIX}model.layers.0.self_attn.q_proj.base_layer.weight",
        f"{PREFIX}model.layers.0.input_layernorm.modules_to_save.default.weight",
        f"{PREFIX}model.layers.0.post_attention_layernorm.original_module.weight",
        f"{PREFIX}model.norm.modules_to_save.default.weight",
        f"{PREFIX}model.embed_tokens.weight",
        f"{PREFIX}lm_head.weight",
        "input_resampler.proj.0.weight",
        "output_resampler.proj.2.bias",
        *SKIPPABLE_EXTRAS,
    ):
        assert key in keys, key


@pytest.mark.parametrize("variant", ["release", "trainable-only, rank 16, sharded base"])
def test_loading_reproduces_the_known_module(
    variant: str, known: AnimeGamerMLLM, release: ReleaseFiles, tokenizer: AnimeGamerTokenizer, tmp_path: Path
) -> None:
    if variant != "release":  # scale alpha / r = 2, no frozen copies in the file, an index over two shards
        release = write_release_mllm(known, tmp_path, rank=16, shards=2, trainable_only=True, seed=3)
    loaded = load(release)

    expected = known.state_dict()
    got = loaded.state_dict()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, msg=key)

    deltas = StateDeltas(motion=1, social=0, entertainment=-1, stamina=2)
    history = [HistoryTurn(instruction=EARLIER, representation=b"", deltas=deltas)]
    representation = torch.randn(226, REPRESENTATION_DIM, generator=torch.Generator().manual_seed(0))
    for past, reps in (([], []), (history, [representation])):
        prompt = build_prompt(tokenizer, NOW, past)
        ids = torch.tensor([prompt.ids])
        torch.testing.assert_close(loaded.llm(input_ids=ids).logits, known.llm(input_ids=ids).logits)
        embeds = loaded.embed_prompt(prompt, reps)
        torch.testing.assert_close(embeds, known.embed_prompt(prompt, reps))
        torch.testing.assert_close(
            loaded.predict_representation(embeds, prompt), known.predict_representation(embeds, prompt)
        )
        torch.testing.assert_close(loaded.state_logits(embeds, tokenizer)[0], known.state_logits(embeds, tokenizer)[0])


def test_default_dtype_is_bf16(known: AnimeGamerMLLM, release: ReleaseFiles) -> None:
    loaded = load(release, dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in loaded.parameters())
    weight = "llm.model.layers.1.mlp.gate_proj.weight"
    torch.testing.assert_close(loaded.state_dict()[weight].float(), known.state_dict()[weight], rtol=1e-2, atol=1e-2)


def test_config_is_read_from_config_json(release: ReleaseFiles) -> None:
    assert mllm_config_from_dir(release.mistral_dir) == tiny().mllm


def test_missing_config_json(release: ReleaseFiles, tmp_path: Path) -> None:
    mistral_dir = tmp_path / "Mistral-7B-Instruct-v0.1"
    shutil.copytree(release.mistral_dir, mistral_dir)
    (mistral_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: missing") as caught:
        load_mllm(mistral_dir, release.mllm_file, vocab_size=543, representation_dim=REPRESENTATION_DIM)
    assert caught.value.path == mistral_dir / "config.json"


def test_malformed_config_json_names_the_field(release: ReleaseFiles, tmp_path: Path) -> None:
    raw = json.loads((release.mistral_dir / "config.json").read_text())
    del raw["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"config\.json: has no 'num_key_value_heads'"):
        mllm_config_from_dir(tmp_path)
    (tmp_path / "config.json").write_text('{"hidden_size": 64,')
    with pytest.raises(CheckpointError, match=r"config\.json: unreadable"):
        mllm_config_from_dir(tmp_path)


def test_missing_tensor_names_file_key_and_shape(release: ReleaseFiles, tmp_path: Path) -> None:
    key = f"{PREFIX}model.layers.1.mlp.down_proj.lora_B.default.weight"
    path = rewrite(release, tmp_path, {key: None})
    with pytest.raises(CheckpointError) as caught:
        load(release, path)
    assert caught.value.path == path
    assert f"missing tensor(s) {key} [64, 32]" in str(caught.value)


def test_wrong_shape_names_key_found_and_expected(release: ReleaseFiles, tmp_path: Path) -> None:
    key = f"{PREFIX}model.embed_tokens.weight"
    path = rewrite(release, tmp_path, {key: torch.zeros(542, 64)})
    with pytest.raises(CheckpointError) as caught:
        load(release, path)
    assert caught.value.path == path
    assert f"{key} has shape [542, 64], expected [543, 64]" in str(caught.value)


def test_unexpected_tensor_is_refused(release: ReleaseFiles, tmp_path: Path) -> None:
    key = f"{PREFIX}model.layers.2.self_attn.q_proj.lora_A.default.weight"  # a layer the config does not have
    path = rewrite(release, tmp_path, {key: torch.zeros(32, 64)})
    with pytest.raises(CheckpointError, match=rf"unexpected tensor\(s\) {key}") as caught:
        load(release, path)
    assert caught.value.path == path


def test_truncated_mllm_file(release: ReleaseFiles, tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    data = release.mllm_file.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as caught:
        load(release, path)
    assert caught.value.path == path


def test_truncated_base_weights(release: ReleaseFiles, tmp_path: Path) -> None:
    mistral_dir = tmp_path / "Mistral-7B-Instruct-v0.1"
    shutil.copytree(release.mistral_dir, mistral_dir)
    weights = mistral_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="unreadable") as caught:
        load_mllm(mistral_dir, release.mllm_file, vocab_size=543, representation_dim=REPRESENTATION_DIM)
    assert caught.value.path == weights


def test_missing_base_tensor_names_key_and_shape(release: ReleaseFiles, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    mistral_dir = tmp_path / "Mistral-7B-Instruct-v0.1"
    shutil.copytree(release.mistral_dir, mistral_dir)
    weights = mistral_dir / "model.safetensors"
    tensors = load_file(weights)
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, weights)
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) model.layers.0.mlp.up_proj.weight \[128, 64\]"):
        load_mllm(mistral_dir, release.mllm_file, vocab_size=543, representation_dim=REPRESENTATION_DIM)


def test_no_base_weights(release: ReleaseFiles, tmp_path: Path) -> None:
    shutil.copy(release.mistral_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="holds no weights") as caught:
        load_mllm(tmp_path, release.mllm_file, vocab_size=543, representation_dim=REPRESENTATION_DIM)
    assert caught.value.path == tmp_path
