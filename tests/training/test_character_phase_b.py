"""Phase (b) for the published architecture, at the tiny sizes: the MLLM learns given representations and states.

The targets here are fixed random representations (phase (a), which makes them from clips, is not built for the
published architecture yet): what is tested is that this phase's losses, history windows and trained parts work
through the shared run loop, and that what it trains is what the planner counts and the exporter writes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from game.state import StateDeltas
from media.mp4 import encode_mp4
from tests.training.character_windows import windows
from training.character_phase_b import RepresentationAndStates, answer_ids, trainable
from training.config import TrainConfig
from training.loop import LOSSES, read_losses, train
from worker.pipeline.config import get_config
from worker.pipeline.mllm import parse_states
from worker.pipeline.pipeline import AnimeGamerPipeline


@pytest.fixture(scope="module")
def tiny_mllm():
    pipe = AnimeGamerPipeline.random_weights(get_config("tiny"))
    trainable(pipe.mllm)
    return pipe


def test_the_answer_is_the_state_tokens_the_release_writes(tiny_mllm) -> None:
    deltas = StateDeltas(motion=-5, social=0, entertainment=4, stamina=5)
    ids = answer_ids(tiny_mllm.tokenizer, deltas)
    assert len(ids) == 11
    prompt_end = [tiny_mllm.tokenizer.token_id("<ML>")]
    assert parse_states(prompt_end + ids, tiny_mllm.tokenizer) == deltas


def test_only_the_adapters_norms_resamplers_and_embeddings_train(tiny_mllm) -> None:
    trained = {name for name, p in tiny_mllm.mllm.named_parameters() if p.requires_grad}
    assert any(".lora_A." in name for name in trained) and any("resampler" in name for name in trained)
    frozen = [name for name, p in tiny_mllm.mllm.named_parameters() if not p.requires_grad]
    assert frozen and all(name.endswith("base_layer.weight") for name in frozen)


def test_both_losses_fall_over_windows_of_one_to_three_turns(tiny_mllm, tmp_path: Path) -> None:
    data = windows(tiny_mllm.config.num_query_tokens, tiny_mllm.config.decoder.hidden_size)
    model = RepresentationAndStates(tiny_mllm.mllm, tiny_mllm.tokenizer, regression_weight=5.0)
    with torch.no_grad():
        before = [model.losses(window) for window in data]
    config = TrainConfig(steps=40, batch_size=2, learning_rate=3e-3, eval_every=0, checkpoint_every=0)
    result, trained, _ = train(model, data, None, list, config, tmp_path / "b", {"sizes": "tiny"})
    assert result.step == 40 and len(result.losses) == 40
    with torch.no_grad():
        after = [trained.losses(window) for window in data]
    for kind in (0, 1):  # regression, then the answer's cross-entropy
        first, last = (sum(float(pair[kind]) for pair in run) for run in (before, after))
        assert last < 0.7 * first, (kind, first, last)


def test_gradient_checkpointing_gives_the_same_losses_and_gradients() -> None:
    pipes = [AnimeGamerPipeline.random_weights(get_config("tiny")) for _ in range(2)]
    for pipe, on in zip(pipes, (False, True), strict=True):
        trainable(pipe.mllm, checkpointing=on)
    pipes[1].mllm.load_state_dict(pipes[0].mllm.state_dict())  # the same LoRA draw in both
    window = windows(pipes[0].config.num_query_tokens, pipes[0].config.decoder.hidden_size)[2]
    losses = []
    for pipe in pipes:
        model = RepresentationAndStates(pipe.mllm, pipe.tokenizer).train()  # checkpointing needs training mode
        for module in pipe.mllm.modules():  # no LoRA dropout, so the two runs compare
            if isinstance(module, torch.nn.Dropout):
                module.eval()
        regression, states = model.losses(window)
        (regression + states).backward()
        losses.append((regression.detach(), states.detach()))
    assert pipes[1].mllm.llm.is_activation_checkpointing and not pipes[0].mllm.llm.is_activation_checkpointing
    torch.testing.assert_close(losses[0], losses[1])
    named = [dict(pipe.mllm.named_parameters()) for pipe in pipes]
    for name, param in named[0].items():
        if param.requires_grad:
            torch.testing.assert_close(param.grad, named[1][name].grad, msg=name)


def test_a_stopped_and_resumed_run_ends_with_the_weights_of_one_never_stopped(tmp_path: Path) -> None:
    """LoRA dropout on (p = 0.05) draws from the global generator: the loop seeds it per step, so the masks after
    a resume are the ones an unstopped run drew."""

    def model() -> RepresentationAndStates:
        torch.manual_seed(0)
        pipe = AnimeGamerPipeline.random_weights(get_config("tiny"))
        trainable(pipe.mllm)
        return RepresentationAndStates(pipe.mllm, pipe.tokenizer)

    first = model()
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in first.modules())
    data = windows(first.mllm.num_query_tokens, first.mllm.representation_dim)
    config = TrainConfig(steps=8, batch_size=2, learning_rate=3e-3, eval_every=0, checkpoint_every=3)
    _, whole, _ = train(first, data, None, list, config, tmp_path / "whole", {"sizes": "tiny"})

    def stop_at_5(step: int, loss: float) -> None:
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(model(), data, None, list, config, tmp_path / "stopped", {"sizes": "tiny"}, on_step=stop_at_5)
    _, resumed, _ = train(model(), data, None, list, config, tmp_path / "stopped", {"sizes": "tiny"})
    for (name, want), got in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
    logged = [json.loads(line)["step"] for line in (tmp_path / "stopped" / LOSSES).read_text().splitlines()]
    assert logged == list(range(1, 9))  # steps 4 and 5 ran twice (saved at 3), logged once
    assert read_losses(tmp_path / "stopped") == read_losses(tmp_path / "whole")


@pytest.mark.slow
def test_two_processes_train_as_one_at_the_same_global_batch(tmp_path: Path) -> None:
    """Phase (b) in two processes (torch.distributed on the CPU, gloo) with two windows each, against one process
    with four: the same steps over the same windows, so the same weights up to the order of float sums."""
    script = Path(__file__).with_name("phase_b_processes.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}  # accelerate: gloo on the CPU
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run([sys.executable, str(script), str(one), "--batch", "4"], check=True, env=env, timeout=300)
    with socket.socket() as probe:  # a free port for the processes' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    subprocess.run([*launch, str(script), str(two), "--batch", "2"], check=True, env=env, timeout=300)
    alone, together = (torch.load(folder / "trained.pt") for folder in (one, two))
    assert (alone["processes"], together["processes"]) == (1, 2)
    assert sorted(alone["losses"]) == sorted(together["losses"]) == [1, 2, 3, 4]
    for step, loss in alone["losses"].items():
        assert abs(loss - together["losses"][step]) < 1e-4 * max(1.0, abs(loss)), (step, loss, together["losses"])
    assert alone["weights"].keys() == together["weights"].keys()
    for name, weight in alone["weights"].items():
        torch.testing.assert_close(together["weights"][name], weight, rtol=1e-4, atol=1e-5, msg=name)


def test_a_prepared_data_set_gives_each_turn_with_the_turns_before_it(tiny_mllm, tmp_path: Path) -> None:
    from tests.training.test_own_clips import good, write_lines
    from training.character_phase_b import windows_from
    from training.own_clips import prepare

    source = tmp_path / "clips"
    source.mkdir()
    levels = np.broadcast_to(np.arange(24 * 3, dtype=np.uint8)[:, None, None, None], (72, 64, 96, 3))
    (source / "clip.mp4").write_bytes(encode_mp4(np.ascontiguousarray(levels), 24))
    lines = [good(file="clip.mp4", start=0.0, end=2.5, episode="day", ML=m) for m in (1, 2, 3)] + [
        good(file="clip.mp4", start=0.5, end=2.5, ST=4)
    ]
    write_lines(source, lines)
    prepare(source, tmp_path / "data", size=(64, 96))
    shape = (tiny_mllm.config.num_query_tokens, tiny_mllm.config.decoder.hidden_size)
    reps = {
        key: torch.full(shape, float(i))
        for i, key in enumerate(["episode_00000/0", "episode_00000/1", "episode_00000/2", "episode_00001/0"])
    }
    made = windows_from(tmp_path / "data", reps)
    assert [len(window) for window in made] == [1, 2, 3, 1]
    assert [window[-1].deltas.motion for window in made] == [1, 2, 3, 3]
    assert made[3][-1].deltas.stamina == 4 and float(made[2][0].representation[0, 0]) == 0.0
    regression, states = RepresentationAndStates(tiny_mllm.mllm, tiny_mllm.tokenizer).losses(made[2])
    assert torch.isfinite(regression) and torch.isfinite(states)
    with pytest.raises(KeyError, match="episode_00001/0"):
        windows_from(tmp_path / "data", {k: v for k, v in reps.items() if k != "episode_00001/0"})
