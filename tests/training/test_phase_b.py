"""Phase (b): the batched training forward is inference's two passes, its last steps see the model's own past
predictions as inference does, the losses fall, bad inputs are named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from game.contract import HistoryTurn
from game.state import StateDeltas
from tests import tiers
from training.config import ToyModelConfig, TrainConfig
from training.dataset import load_toyworld, split
from training.loop import CheckpointMismatchError, mean
from training.phase_b import (
    OUTPUTS,
    TEACHER_STAGE,
    PhaseData,
    PhaseError,
    PromptCollate,
    TurnSample,
    deltas_of,
    mllm_forward,
    own_predictions,
    stages,
    train_phase_b,
    turn_samples,
    without_history,
)
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.prompt import build_prompt
from worker.pipeline.tokenizer import AnimeGamerTokenizer

# 20 steps on true pasts, then 10 on the model's own predictions
CONFIG = TrainConfig(
    steps=30, batch_size=4, learning_rate=2e-3, eval_every=10, checkpoint_every=5, held_out_every=2, own_history=1 / 3
)
MODEL = ToyModelConfig()
N = MODEL.pipeline.num_query_tokens


def test_each_turn_sees_at_most_the_window_of_past_turns(tiny_world: Path) -> None:
    episodes = load_toyworld(tiny_world).episodes
    samples = turn_samples(episodes, window=2)
    assert len(samples) == sum(len(e.clips) for e in episodes)
    assert all(len(s.history) <= 1 for s in samples)
    first_turns = [s for s in samples if not s.history]
    assert len(first_turns) == len(episodes)  # only an episode's first turn starts without history


def test_the_batched_forward_is_what_inference_computes() -> None:
    torch.manual_seed(0)
    tokenizer = AnimeGamerTokenizer.tiny()
    p = MODEL.pipeline
    mllm = AnimeGamerMLLM(p.mllm, tokenizer.vocab_size, p.decoder.hidden_size, N).eval()
    deltas = [StateDeltas(motion=m, social=1, entertainment=-2, stamina=3) for m in (1, 4, 2)]
    instructions = [
        "Character: Qiqi; Motion: gently walk; Background: day town.",
        "Character: Qiqi; Motion: quickly run around; Background: evening street.",
        "Character: Momo; Motion: slowly sit down; Background: night bedroom.",
    ]
    representations = torch.randn(3, N, p.decoder.hidden_size)
    collate = PromptCollate(tokenizer, instructions, deltas, representations, N)
    # a turn with one past turn, batched beside a shorter one: padding must not change either row
    batch = collate([TurnSample(clip=1, history=(0,)), TurnSample(clip=2, history=())])
    with torch.no_grad():
        batched_rep, batched_logits = mllm_forward(mllm, batch)

    history = [HistoryTurn(instruction=instructions[0], representation=b"", deltas=deltas[0])]
    prompt = build_prompt(tokenizer, instructions[1], history, N)
    embeds = mllm.embed_prompt(prompt, [representations[0]])
    alone_rep = mllm.predict_representation(embeds, prompt)[0]
    alone_logits, _ = mllm.state_logits(embeds, tokenizer)  # (4, 11); only the first slot is not teacher-dependent
    torch.testing.assert_close(batched_rep[0], alone_rep, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(batched_logits[0, 0, tokenizer.strength_ids], alone_logits[0], atol=1e-5, rtol=1e-4)

    prompt = build_prompt(tokenizer, instructions[2], [], N)
    embeds = mllm.embed_prompt(prompt, [])
    torch.testing.assert_close(batched_rep[1], mllm.predict_representation(embeds, prompt)[0], atol=1e-5, rtol=1e-4)


def test_own_predictions_are_what_inference_predicts_turn_after_turn() -> None:
    torch.manual_seed(0)
    tokenizer = AnimeGamerTokenizer.tiny()
    p = MODEL.pipeline
    mllm = AnimeGamerMLLM(p.mllm, tokenizer.vocab_size, p.decoder.hidden_size, N).eval()
    deltas = [StateDeltas(motion=m, social=0, entertainment=1, stamina=-1) for m in (1, 3, 2)]
    instructions = [
        "Character: Qiqi; Motion: gently walk; Background: day town.",
        "Character: Qiqi; Motion: quickly run around; Background: day town.",
        "Character: Qiqi; Motion: slowly sit down; Background: evening town.",
    ]
    encoded = torch.randn(3, N, p.decoder.hidden_size)  # what the encoder made of the true clips
    samples = [TurnSample(0, (), 0), TurnSample(1, (0,), 1), TurnSample(2, (0, 1), 2)]
    predicted = own_predictions(mllm, PhaseData(samples, PromptCollate(tokenizer, instructions, deltas, encoded, N)))

    # inference, a turn at a time: each past turn carries what was predicted for it, never the encoded truth
    past: list[torch.Tensor] = []
    for k in range(3):
        history = [HistoryTurn(instruction=instructions[i], representation=b"", deltas=deltas[i]) for i in range(k)]
        prompt = build_prompt(tokenizer, instructions[k], history, N)
        with torch.no_grad():
            past.append(mllm.predict_representation(mllm.embed_prompt(prompt, past), prompt)[0])
    torch.testing.assert_close(predicted, torch.stack(past), atol=1e-5, rtol=1e-4)


def test_targets_are_the_turns_true_strengths(tiny_world: Path) -> None:
    episodes = load_toyworld(tiny_world).episodes
    tokenizer = AnimeGamerTokenizer.tiny()
    truth = deltas_of(episodes)
    instructions = [c.instruction for e in episodes for c in e.clips]
    collate = PromptCollate(tokenizer, instructions, truth, torch.zeros(len(truth), N, 4), N)
    batch = collate(turn_samples(episodes, 3)[:4])
    for row, target in enumerate(batch["target_states"].tolist()):
        d = truth[row]
        assert [tokenizer.strength_value(t) for t in target] == [d.motion, d.social, d.entertainment, d.stamina]


def test_the_stages_run_without_pasts_then_true_pasts_then_its_own() -> None:
    planned = stages(TrainConfig(steps=10, no_history=0.5, own_history=0.2))
    assert [(stage.pasts, stage.steps) for stage in planned] == [("none", 5), ("true", 3), ("own", 2)]
    assert planned[-1].folder == ""  # the last stage's state is the phase's own


def test_prompts_without_history_keep_every_turn_and_its_target(tiny_world: Path) -> None:
    samples = turn_samples(load_toyworld(tiny_world).episodes, window=3)
    collate = object()  # carried through untouched: the same targets, nothing encoded again
    alone = without_history(PhaseData(samples, collate))  # type: ignore[arg-type]
    assert [s.clip for s in alone.samples] == [s.clip for s in samples] and alone.collate is collate
    assert any(s.history for s in samples) and not any(s.history for s in alone.samples)


@pytest.fixture(scope="module")
@tiers.slow_fixture  # trains phase (b) for about 15 s: its tests run in the slow tier
def trained(tiny_world: Path, tiny_phase_a: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("phase-b")
    return out, train_phase_b(tiny_world, out, tiny_phase_a, CONFIG, MODEL)


def test_loss_falls_and_outputs_are_saved(trained) -> None:
    out, result = trained
    values = [result.losses[s] for s in sorted(result.losses)]
    assert len(values) == CONFIG.steps
    assert mean(values[-5:]) < 0.7 * mean(values[:5])
    assert all((out / name).is_file() for name in OUTPUTS)
    assert result.eval_losses  # held-out episodes were evaluated


def test_the_last_steps_are_trained_apart_from_the_first(trained) -> None:
    out, result = trained
    assert (out / TEACHER_STAGE / "state").is_dir()  # the steps on true pasts, finished and kept for a resume
    assert sorted(result.losses) == list(range(1, CONFIG.steps + 1))  # numbered as one run


def test_a_finished_run_resumes_to_nothing(tiny_world: Path, tiny_phase_a: Path, trained) -> None:
    out, _ = trained
    again = train_phase_b(tiny_world, out, tiny_phase_a, CONFIG, MODEL)
    assert again.step == CONFIG.steps and again.losses == {}


def test_interrupted_and_resumed_equals_uninterrupted(tiny_world: Path, tiny_phase_a: Path, trained, tmp_path) -> None:
    _, expected = trained

    def crash(step: int, loss: float) -> None:
        if step == 25:  # on the model's own pasts, just after that stage's step-5 checkpoint
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_phase_b(tiny_world, tmp_path, tiny_phase_a, CONFIG, MODEL, on_step=crash)
    resumed = train_phase_b(tiny_world, tmp_path, tiny_phase_a, CONFIG, MODEL)
    assert sorted(resumed.losses) == list(range(26, CONFIG.steps + 1))
    assert resumed.losses[CONFIG.steps] == pytest.approx(expected.losses[CONFIG.steps], abs=1e-5)


def test_missing_phase_a_is_named(tiny_world: Path, tmp_path: Path) -> None:
    with pytest.raises(PhaseError, match=r"encoder\.pt is missing: run `animegamer train phase-a`"):
        train_phase_b(tiny_world, tmp_path / "b", tmp_path / "nothing", CONFIG, MODEL)


def test_phase_a_of_other_sizes_is_refused(tiny_world: Path, tiny_phase_a: Path, tmp_path: Path) -> None:
    other = replace(MODEL, encoder_hidden=64)
    with pytest.raises(PhaseError, match=r"encoder\.hidden: file 256, config 64"):
        train_phase_b(tiny_world, tmp_path / "b", tiny_phase_a, CONFIG, other)


def test_its_own_state_of_another_config_is_refused(tiny_world: Path, tiny_phase_a: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    train_phase_b(tiny_world, out, tiny_phase_a, replace(CONFIG, steps=1), MODEL)
    with pytest.raises(CheckpointMismatchError, match=r"mllm\.history_window: checkpoint 3, current 2"):
        train_phase_b(tiny_world, out, tiny_phase_a, replace(CONFIG, steps=2), replace(MODEL, history_window=2))


def test_held_out_split_matches_phase_a(tiny_world: Path) -> None:
    training, held_out = split(load_toyworld(tiny_world), CONFIG.held_out_every)
    assert training and held_out and not {e.id for e in training} & {e.id for e in held_out}
