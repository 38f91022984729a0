"""Phase (c): the decoder adapts to the MLLM's predictions; the loss falls; earlier phases are checked by name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from training.config import ToyModelConfig, TrainConfig
from training.dataset import load_toyworld
from training.loop import mean
from training.phase_b import PhaseBModel, PhaseError
from training.phase_c import OUTPUTS, UNCONDITIONAL, PhaseCModel, predict_representations, train_phase_c
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.prompt import build_prompt

CONFIG = TrainConfig(
    steps=30, batch_size=4, learning_rate=2e-3, eval_every=10, checkpoint_every=10, held_out_every=2, figure_weight=3.0
)
MODEL = ToyModelConfig()


@pytest.fixture(scope="module")
def adapted(tiny_world: Path, tiny_phase_a: Path, tiny_phase_b: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("phase-c")
    return out, train_phase_c(tiny_world, out, tiny_phase_a, tiny_phase_b, CONFIG, MODEL)


def test_loss_falls_and_outputs_are_saved(adapted) -> None:
    out, result = adapted
    values = [result.losses[s] for s in sorted(result.losses)]
    assert len(values) == CONFIG.steps
    assert mean(values[-5:]) < mean(values[:5])
    assert all((out / name).is_file() for name in OUTPUTS)


def test_the_decoder_starts_from_phase_a_and_moves(adapted, tiny_phase_a: Path) -> None:
    out, _ = adapted
    before = torch.load(tiny_phase_a / "decoder.pt", weights_only=True)
    after = torch.load(out / "decoder.pt", weights_only=True)
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_some_conditions_are_the_unconditional_tokens() -> None:
    decoder = AnimeGamerDecoder.from_pipeline_config(MODEL.pipeline.decoder)
    model = PhaseCModel(decoder, MODEL.pipeline.sampler.shift_scale)
    seen: list[torch.Tensor] = []
    decoder.register_forward_hook(lambda module, args, output: seen.append(args[2]))
    p = MODEL.pipeline
    B = 64
    batch = {
        "latents": torch.randn(B, p.latent_frames, p.decoder.latent_channels, p.latent_height, p.latent_width),
        "condition": torch.randn(B, p.num_query_tokens, p.decoder.hidden_size),
        "flow": torch.ones(B),
        "cells": torch.zeros(B, p.latent_frames, 1, p.latent_height, p.latent_width),
    }
    model(batch, torch.Generator().manual_seed(0))
    unconditional = decoder.unconditional_tokens(1)[0]
    dropped = sum(torch.equal(row, unconditional) for row in seen[0])
    assert 0 < dropped < B and abs(dropped / B - UNCONDITIONAL) < 0.15


def test_missing_phase_b_is_named(tiny_world: Path, tiny_phase_a: Path, tmp_path: Path) -> None:
    with pytest.raises(PhaseError, match=r"mllm\.pt is missing: run `animegamer train phase-b`"):
        train_phase_c(tiny_world, tmp_path / "c", tiny_phase_a, tmp_path / "none", CONFIG, MODEL)


def test_phase_b_of_another_window_is_refused(
    tiny_world: Path, tiny_phase_a: Path, tiny_phase_b: Path, tmp_path: Path
) -> None:
    with pytest.raises(PhaseError, match=r"mllm\.history_window: file 3, config 2"):
        train_phase_c(tiny_world, tmp_path / "c", tiny_phase_a, tiny_phase_b, CONFIG, replace(MODEL, history_window=2))


def test_its_conditions_are_what_the_game_predicts_from_the_instruction_alone(tiny_world: Path) -> None:
    # the game plays with history_window 1: no past turn in the prompt, so neither in phase (c)'s conditions
    torch.manual_seed(0)
    tokenizer = MODEL.tokenizer()
    model = PhaseBModel(MODEL, tokenizer).eval()
    episodes = load_toyworld(tiny_world).episodes
    predicted = predict_representations(model, episodes, MODEL)
    alone = []
    for episode in episodes:
        for clip in episode.clips:
            prompt = build_prompt(tokenizer, clip.instruction, [], MODEL.pipeline.num_query_tokens)
            with torch.no_grad():
                alone.append(model.mllm.predict_representation(model.mllm.embed_prompt(prompt, []), prompt)[0])
    assert any(len(episode.clips) > 1 for episode in episodes)  # later turns, which a window would give pasts
    torch.testing.assert_close(predicted, torch.stack(alone), atol=1e-5, rtol=1e-4)
