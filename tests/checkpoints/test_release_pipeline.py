"""A tiny checkpoint tree in the published layout loads through the code that loads the real one."""

from __future__ import annotations

import shutil

import pytest
import torch

from game.contract import TurnRequest
from media.mp4 import decode_mp4
from tests.checkpoints.release_tree import write_tiny_release
from tests.cli_run import run_cli
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.load import Clip, check, load_release_pipeline
from worker.pipeline.loading import load_pipeline
from worker.pipeline.pipeline import PipelineLoadError

LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
CLIP = Clip(num_frames=17, height=64, width=96)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_tiny_release(tmp_path_factory.mktemp("checkpoints"))


def test_a_tiny_release_tree_plays_a_turn(release):
    pipe = load_release_pipeline(release.root, "Qiqi", device="cpu", clip=CLIP, num_steps=4)
    result = pipe(TurnRequest(job_id="1", instruction=LINE, seed=3))
    assert decode_mp4(result.mp4).shape == (17, 64, 96, 3)
    assert result.model == "animegamer" and result.label == ""


def test_the_loaded_parts_compute_what_the_known_modules_compute(release):
    pipe = load_release_pipeline(release.root, "Qiqi", device="cpu", clip=CLIP, num_steps=4)
    x = torch.randn(2, 5, 4, 8, 12)
    condition = torch.randn(2, 226, release.config.decoder.hidden_size)
    args = (x, torch.tensor([999.0, 500.0]), condition, torch.tensor([0.5, 40.0]))
    torch.testing.assert_close(pipe.decoder(*args), release.decoder(*args))
    ids = torch.tensor([[1, 5, 9, 33]])
    torch.testing.assert_close(pipe.mllm.llm(input_ids=ids).logits, release.mllm.llm(input_ids=ids).logits)


def test_sizes_come_from_the_files(release):
    pipe = load_release_pipeline(release.root, "Qiqi", device="cpu", clip=CLIP)
    assert pipe.config.mllm == release.config.mllm
    assert pipe.config.decoder == release.config.decoder
    assert pipe.config.vae.block_out_channels == release.config.vae.block_out_channels


def test_a_character_without_its_own_decoder_is_refused_naming_the_pair(tmp_path):
    tree = write_tiny_release(tmp_path, characters=("Qiqi",))
    (tree.root / "AnimeGamer" / "MLLM-Qiqi").rename(tree.root / "AnimeGamer" / "MLLM-Sosuke")
    with pytest.raises(CheckpointError, match=r"MLLM-Qiqi.*adapted with its own decoder"):
        load_release_pipeline(tree.root, "Qiqi", device="cpu", clip=CLIP)


def test_check_reports_every_part_and_the_sizes_that_differ_from_the_published(release):
    (report,) = check(release.root, ("Qiqi",))
    text = "\n".join(report.lines)
    assert report.ok, text
    assert "tokenizer.model" in text and "mp_rank_00_model_states.pt" in text and "3d-vae.pt" in text
    assert "num_layers 2 (published 30)" in text


def test_check_names_a_half_downloaded_file(release, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(release.root, copy)
    vae = copy / "vae" / "3d-vae.pt"
    vae.write_bytes(vae.read_bytes()[: vae.stat().st_size // 2])
    (report,) = check(copy, ("Qiqi",))
    assert not report.ok
    assert any("FAIL" in line and "3d-vae.pt" in line and "truncated" in line for line in report.lines)


def test_the_checkpoints_check_command_prints_the_report_and_fails_on_a_missing_character(
    release, tmp_path, capsys, monkeypatch
):
    done = run_cli("checkpoints", "check", str(release.root), cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    assert "Qiqi" in done.stdout and "ok" in done.stdout
    assert "Sosuke" in done.stdout and "FAIL" in done.stdout  # this tree holds only Qiqi's pair
    assert done.returncode == 0  # at least one character can be played


def test_the_published_model_without_a_gpu_says_so_and_offers_tiny():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(PipelineLoadError, match="ANIMEGAMER_MODEL=tiny"):
        load_pipeline("animegamer", device="auto")
