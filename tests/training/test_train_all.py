"""`train all`: the three phases in order into one run folder, ending with the file the toy model loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from animegamer.cli import main
from game.contract import TurnRequest
from training.config import ToyModelConfig, TrainConfig
from training.run_all import MODEL_FILE, train_all
from worker.pipeline.toy import LABEL, load_toy_pipeline

QUICK = TrainConfig(steps=3, batch_size=2, eval_every=3, checkpoint_every=0, held_out_every=2, vae_steps=2)
RECIPE = {"phase-a": QUICK, "phase-b": QUICK, "phase-c": QUICK}


@pytest.fixture(scope="module")
def run(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("all")
    result = train_all(tiny_world, out, RECIPE, ToyModelConfig())
    assert result.steps == {"phase-a": 3, "phase-b": 3, "phase-c": 3}
    assert set(result.held_out) == {"phase-a", "phase-b", "phase-c"}
    return out


def test_the_model_file_plays_a_turn(run: Path) -> None:
    pipeline = load_toy_pipeline(run / MODEL_FILE, num_steps=2)
    result = pipeline(
        TurnRequest(job_id="all-1", instruction="Character: Qiqi; Motion: gently walk; Background: day town.", seed=3)
    )
    assert result.label == LABEL and result.num_frames == 17 and result.mp4[4:8] == b"ftyp"


def test_a_rerun_trains_nothing_and_writes_the_same_weights(run: Path, tiny_world: Path) -> None:
    before = load_file(run / MODEL_FILE)
    again = train_all(tiny_world, run, RECIPE, ToyModelConfig())
    assert again.steps == {"phase-a": 3, "phase-b": 3, "phase-c": 3}
    after = load_file(run / MODEL_FILE)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_one_phase_from_the_cli_reads_the_earlier_ones_from_the_run(
    run: Path, tiny_world: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    shutil.copytree(run / "phase_a", tmp_path / "phase_a")
    args = ["train", "phase-b", "--data", str(tiny_world), "--out", str(tmp_path), "--model", "tiny"]
    assert main([*args, "--steps", "2", "--batch-size", "2"]) == 0
    assert "Phase b at step 2, last loss" in capsys.readouterr().out
    assert (tmp_path / "phase_b" / "mllm.pt").is_file()


def test_a_phase_before_its_inputs_says_which_to_run(tiny_world: Path, tmp_path: Path, capsys) -> None:
    args = ["train", "phase-c", "--data", str(tiny_world), "--out", str(tmp_path), "--model", "tiny"]
    assert main(args) == 1
    assert "run `animegamer train phase-a`" in capsys.readouterr().err


def test_all_refuses_one_phases_schedule_flags(tiny_world: Path, tmp_path: Path, capsys) -> None:
    assert main(["train", "all", "--data", str(tiny_world), "--out", str(tmp_path), "--steps", "5"]) == 2
    assert "schedule flags apply to one phase only" in capsys.readouterr().err


def test_without_phase_c_the_model_file_carries_phase_as_decoder(tiny_world: Path, tmp_path: Path) -> None:
    result = train_all(tiny_world, tmp_path, {"phase-a": QUICK, "phase-b": QUICK}, ToyModelConfig())
    assert result.steps == {"phase-a": 3, "phase-b": 3} and not (tmp_path / "phase_c").exists()
    shipped = load_file(tmp_path / MODEL_FILE)
    decoder = torch.load(tmp_path / "phase_a" / "decoder.pt", weights_only=True)
    assert all(torch.equal(shipped[f"decoder.{k}"], v.float()) for k, v in decoder.items())
