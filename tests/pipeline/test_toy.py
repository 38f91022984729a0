"""The toy model's file: written and read back exactly, the shipped one loads, and every wrong file is named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from game.contract import TurnRequest
from relay.settings import Settings
from training import metrics
from training.toyworld import CHARACTERS_BY_NAME
from worker.pipeline.config import tiny
from worker.pipeline.loading import load_pipeline
from worker.pipeline.pipeline import AnimeGamerPipeline, PipelineLoadError
from worker.pipeline.toy import (
    LABEL,
    SHIPPED,
    TOY_HISTORY_WINDOW,
    ToyCheckpointError,
    load_toy_pipeline,
    save_toy_checkpoint,
)

INSTRUCTION = "Character: Qiqi; Motion: gently walk; Background: day town."


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, AnimeGamerPipeline]:
    """A tiny pipeline with other weights than the loader's own seed, saved in the toy format."""
    source = AnimeGamerPipeline.random_weights(replace(tiny(), weights_seed=7))
    parts = {"mllm": source.mllm.state_dict(), "decoder": source.decoder.state_dict(), "vae": source.vae.state_dict()}
    path = tmp_path_factory.mktemp("toy") / "model.safetensors"
    save_toy_checkpoint(path, parts, "tiny", 0.5, {"steps": {"phase-a": 1}})
    return path, source


def test_a_written_file_loads_every_weight_back(written) -> None:
    path, source = written
    loaded = load_toy_pipeline(path, num_steps=2)
    for ours, theirs in ((loaded.mllm, source.mllm), (loaded.decoder, source.decoder), (loaded.vae, source.vae)):
        for key, value in theirs.state_dict().items():
            torch.testing.assert_close(ours.state_dict()[key], value, rtol=0, atol=0)
    assert loaded.config.name == "toy" and loaded.config.label == LABEL
    assert loaded.config.vae.scaling_factor == 0.5 and loaded.config.sampler.num_steps == 2


def test_a_loaded_file_plays_a_turn(written) -> None:
    path, _ = written
    result = load_toy_pipeline(path, num_steps=2)(TurnRequest(job_id="t1", instruction=INSTRUCTION, seed=1))
    assert result.model == "toy" and result.label == LABEL and result.num_frames == 17


def test_a_file_with_a_word_list_reads_its_words_as_one_id_each(tmp_path: Path) -> None:
    words = ("Character", ":", " Qiqi", ";", " Motion", " gently", " walk", " Background", " day", " town", ".")
    config = replace(tiny(), mllm=replace(tiny().mllm, base_vocab_size=259 + len(words)), weights_seed=3)
    source = AnimeGamerPipeline.random_weights(config)
    parts = {"mllm": source.mllm.state_dict(), "decoder": source.decoder.state_dict(), "vae": source.vae.state_dict()}
    path = tmp_path / "words.safetensors"
    save_toy_checkpoint(path, parts, "tiny", 0.5, {}, words=words)
    loaded = load_toy_pipeline(path, num_steps=2)
    pieces = ["Character", ":", " Qiqi", ";", " Motion", ":", " gently", " walk", ";", " Background", ":", " day"]
    assert loaded.tokenizer.encode(INSTRUCTION) == [259 + words.index(piece) for piece in [*pieces, " town", "."]]
    assert loaded(TurnRequest(job_id="w1", instruction=INSTRUCTION, seed=1)).num_frames == 17


def test_a_file_with_a_broken_word_list_is_named(written, tmp_path: Path) -> None:
    _path, source = written
    parts = {"mllm": source.mllm.state_dict(), "decoder": source.decoder.state_dict(), "vae": source.vae.state_dict()}
    broken = tmp_path / "repeated.safetensors"
    save_toy_checkpoint(broken, parts, "tiny", 0.5, {}, words=(" fly",))
    with safe_open(str(broken), framework="pt") as handle:
        metadata = {**handle.metadata(), "vocabulary": '[" fly", " fly"]'}
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    from safetensors.torch import save_file

    save_file(tensors, str(broken), metadata=metadata)
    with pytest.raises(ToyCheckpointError, match=r"repeated\.safetensors has no usable .*vocabulary"):
        load_toy_pipeline(broken)


def test_a_missing_file_is_named_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ToyCheckpointError, match=r"nothing\.safetensors is missing: expected the toy model"):
        load_toy_pipeline(tmp_path / "nothing.safetensors")


def test_a_corrupt_file_is_named(written, tmp_path: Path) -> None:
    path, _ = written
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ToyCheckpointError, match=r"broken\.safetensors is not a readable safetensors file"):
        load_toy_pipeline(broken)


def test_a_file_of_another_format_is_named(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    other = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(1)}, str(other), metadata={"format": "pt"})
    with pytest.raises(ToyCheckpointError, match=r"format 'pt' version None; expected 'animegamer-toy' version '1'"):
        load_toy_pipeline(other)


def test_weights_of_other_sizes_are_named(written, tmp_path: Path) -> None:
    _, source = written
    parts = {"mllm": source.mllm.state_dict(), "decoder": source.decoder.state_dict(), "vae": source.vae.state_dict()}
    wrong = tmp_path / "wrong.safetensors"
    save_toy_checkpoint(wrong, parts, "toy", 0.5, {})  # tiny weights, but says toy sizes
    with pytest.raises(ToyCheckpointError, match=r"wrong\.safetensors: the mllm does not fit the toy sizes"):
        load_toy_pipeline(wrong)


def test_the_shipped_model_loads_and_says_what_it_is() -> None:
    assert SHIPPED.is_file(), f"{SHIPPED} should ship with the project"
    pipeline = load_pipeline("toy", device="cpu", num_steps=2)
    assert pipeline.config.name == "toy" and pipeline.config.label == LABEL
    with safe_open(str(SHIPPED), framework="pt") as handle:
        assert int(handle.metadata()["history_window"]) == TOY_HISTORY_WINDOW
    assert SHIPPED.stat().st_size < 30 * 2**20


def test_the_toy_model_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANIMEGAMER_MODEL", raising=False)
    assert Settings(_env_file=None).model == "toy"


def test_a_missing_shipped_file_is_a_load_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("worker.pipeline.toy.SHIPPED", tmp_path / "gone.safetensors")
    with pytest.raises(PipelineLoadError, match=r"gone\.safetensors is missing"):
        load_pipeline("toy", device="cpu")


# Unseen turns, one per character and kind of place; the shipped model's figure is found in most clips
# (benchmarks/toyworld_eval.py measures it on 20 episodes), so most of these must show it.
UNSEEN_TURNS = [
    "Character: Qiqi; Motion: quickly fly on broomstick; Background: day sky.",
    "Character: Sosuke; Motion: gently walk; Background: evening town.",
    "Character: Momo; Motion: slowly lie down; Background: morning grass.",
    "Character: Tombo; Motion: rapidly run; Background: day street.",
    "Character: Qiqi; Motion: smoothly wave to a friend; Background: night bedroom.",
    "Character: Sosuke; Motion: gently sit down; Background: day countryside.",
]


@pytest.mark.slow  # plays the shipped model's turns for about 17 s
def test_the_shipped_model_shows_the_character() -> None:
    pipeline = load_pipeline("toy", device="cpu")
    found = []
    for seed, instruction in enumerate(UNSEEN_TURNS):
        result = pipeline(TurnRequest(job_id=f"show-{seed}", instruction=instruction, seed=seed))
        body = CHARACTERS_BY_NAME[instruction.split(";")[0].removeprefix("Character: ")].body
        found.append(metrics.figure_colour(metrics.decode_mp4(result.mp4), body) is not None)
    assert sum(found) >= 4, found
