"""One worker, one Mistral base, every character: each plays exactly as if loaded alone."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load

from game.contract import TurnRequest
from tests.checkpoints.release_tree import write_two_characters
from tests.cli_run import run_cli
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.load import Clip, load_release_pipeline, load_release_pipelines

CLIP = Clip(num_frames=17, height=64, width=96)
LINES = {
    "Qiqi": "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky.",
    "Sosuke": "Character: Sosuke; Motion: quickly run; Background: morning street.",
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_two_characters(tmp_path_factory.mktemp("two")).root


@pytest.fixture(scope="module")
def together(root):
    return load_release_pipelines(root, ("Qiqi", "Sosuke"), device="cpu", clip=CLIP, num_steps=3)


@pytest.fixture(scope="module")
def alone(root):
    return {c: load_release_pipeline(root, c, device="cpu", clip=CLIP, num_steps=3) for c in ("Qiqi", "Sosuke")}


def _representation_and_states(pipe, line):
    request = TurnRequest(job_id="1", instruction=line, seed=5)
    result = pipe(request)
    return result.deltas, result.representation, result.mp4


def test_the_characters_share_one_mistral_base_and_one_vae(together):
    qiqi, sosuke = together["Qiqi"], together["Sosuke"]
    assert qiqi.mllm is sosuke.mllm and qiqi.vae is sosuke.vae
    assert qiqi.decoder is not sosuke.decoder
    shared_projection = qiqi.mllm.llm.model.layers[0].self_attn.q_proj.weight
    assert shared_projection.data_ptr() == sosuke.mllm.llm.model.layers[0].self_attn.q_proj.weight.data_ptr()


@pytest.mark.parametrize("order", [("Qiqi", "Sosuke", "Qiqi"), ("Sosuke", "Qiqi", "Sosuke")])
def test_each_character_computes_what_its_pipeline_loaded_alone_computes(together, alone, order):
    """Logits and representations after switching back and forth equal the merged single-character load's."""
    for character in order:
        pipe, reference = together[character], alone[character]
        with pipe.mllm_phase():
            ids = torch.tensor([[1, 5, 9, 33, 301]])
            got = pipe.mllm.llm(input_ids=ids).logits
            resampled = pipe.mllm.output_resampler(torch.ones(1, 3, pipe.config.mllm.hidden_size))
        torch.testing.assert_close(got, reference.mllm.llm(input_ids=ids).logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(
            resampled, reference.mllm.output_resampler(torch.ones(1, 3, pipe.config.mllm.hidden_size))
        )


def test_the_two_characters_really_differ(alone):
    ids = torch.tensor([[1, 5, 9, 33, 301]])
    qiqi, sosuke = (alone[c].mllm.llm(input_ids=ids).logits for c in ("Qiqi", "Sosuke"))
    assert (qiqi - sosuke).abs().max() > 1e-2


def test_a_turn_for_each_character_in_turn_matches_its_lone_pipeline(together, alone):
    for character in ("Sosuke", "Qiqi", "Sosuke"):
        deltas, representation, _ = _representation_and_states(together[character], LINES[character])
        ref_deltas, ref_representation, _ = _representation_and_states(alone[character], LINES[character])
        assert deltas == ref_deltas

        got, want = (load(r)["representation"].float() for r in (representation, ref_representation))
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_a_character_file_over_another_base_is_refused(tmp_path):
    from tests.checkpoints.release_mllm import write_release_mllm

    release = write_two_characters(tmp_path)
    torch.manual_seed(2)
    other = type(release.mllm)(
        release.config.mllm, release.mllm.llm.config.vocab_size, release.config.decoder.hidden_size
    )
    write_release_mllm(other, tmp_path, character="Sosuke", seed=2, write_base=False)  # carries its own base copies
    with pytest.raises(CheckpointError, match=r"MLLM-Sosuke.*base weights"):
        load_release_pipelines(tmp_path, ("Qiqi", "Sosuke"), device="cpu", clip=CLIP)


def test_checkpoints_check_prints_the_memory_plan_for_one_character_and_for_all(root, tmp_path, capsys, monkeypatch):
    done = run_cli("checkpoints", "check", str(root), cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    assert done.returncode == 0, done.stderr
    plan_lines = done.stdout.split("GPU memory", 1)[1].splitlines()
    assert any(line.strip().startswith("Qiqi: a GPU with") for line in plan_lines)
    assert any(line.strip().startswith("Qiqi and Sosuke: a GPU with") for line in plan_lines)
    assert sum("peak" in line for line in plan_lines) == 8  # four placements, twice
