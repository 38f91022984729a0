"""`animegamer train plan`: each phase's memory per GPU, counted on the meta device at the published sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from animegamer.cli import main
from training.plan import GIB, Plan, phase_model, saved_bytes
from worker.pipeline.config import get_config


@pytest.fixture(scope="module")
def published() -> dict[str, object]:
    config = get_config("full")
    return {phase: phase_model(config, phase) for phase in "abc"}


def test_the_decoder_phases_train_its_lora_and_motion_embedding_and_phase_a_the_clip_projections(published) -> None:
    lora = 30 * 4 * 64 * (1920 + 1920)  # r=64 on q, k, v, out of 30 blocks, each A (r x in) and B (out x r)
    flow = (1920 * 512 + 512) + (512 * 512 + 512)  # the motion-scope MLP
    projections = (4096 * 1920 + 1920 + 1920 * 1920 + 1920) + (768 * 1920 + 1920 + 1920 * 1920 + 1920) + 4 * 1920
    assert published["c"].trained == lora + flow
    assert published["a"].trained == lora + flow + projections


def test_the_mllm_phase_trains_its_lora_norms_embeddings_and_resamplers(published) -> None:
    per_layer = 32 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + 3 * (4096 + 14336))  # r=32 on the 7 projections
    norms = 32 * 2 * 4096 + 4096
    resamplers = (1920 * 4096 + 4096 + 4096 * 4096 + 4096) + (4096 * 1920 + 1920 + 1920 * 1920 + 1920)
    embeddings = 2 * 32_284 * 4096  # input and output, in full, as the release trains them
    assert published["b"].trained == 32 * per_layer + norms + resamplers + embeddings
    mistral = 7_241_732_096 + 2 * (32_284 - 32_000) * 4096  # Mistral-7B's parameters with the added tokens' rows
    assert published["b"].trained + published["b"].frozen == mistral + 32 * per_layer + resamplers


def test_fused_attention_is_counted_without_its_score_matrix() -> None:
    q, k, v = (torch.empty(1, 4, 512, 64, device="meta", requires_grad=True) for _ in range(3))

    def attention() -> None:
        F.scaled_dot_product_attention(q, k, v)

    fused, _ = saved_bytes(attention, [])
    unfused, _ = saved_bytes(attention, [], fused=False)
    qkv_out = 4 * q.numel() * 4
    assert fused == qkv_out + 4 * 512 * 4  # q, k, v, output and one log-sum-exp a query
    assert unfused >= 4 * 512 * 512 * 4  # the meta device's path keeps the scores


def test_checkpointing_keeps_each_blocks_inputs_and_one_blocks_own() -> None:
    blocks = [nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)).to("meta") for _ in range(3)]
    x = torch.empty(4, 8, device="meta", requires_grad=True)

    def run() -> None:
        h = x
        for block in blocks:
            h = block(h)

    weights = [p for block in blocks for p in block.parameters()]
    unchecked, checked = saved_bytes(run, blocks, weights)
    per_block = (4 * 8 + 4 * 32 + 4 * 32) * 4  # Linear keeps its input, GELU its input, Linear its input
    assert unchecked == 3 * per_block
    assert checked == 3 * (4 * 8 * 4) + per_block


def test_a_full_size_decoder_sample_fits_in_a_few_gib_with_checkpointing_not_without(published) -> None:
    assert published["a"].activations < 2 * GIB < 10 * GIB < published["a"].activations_unchecked
    assert published["a"].sequence == 226 + 5 * 30 * 45  # 6,976 tokens


def test_a_longer_history_window_costs_the_mllm_phase_more() -> None:
    config = get_config("full")
    one, five = phase_model(config, "b", history=1), phase_model(config, "b", history=5)
    assert one.sequence < five.sequence and one.activations < five.activations


def test_fsdp_divides_weights_and_optimizer_state_and_ddp_doubles_the_gradients(published) -> None:
    model = published["b"]
    single, ddp = Plan(model, 1, 8, "ddp", 100), Plan(model, 4, 8, "ddp", 100)
    fsdp = Plan(model, 4, 8, "fsdp", 100)
    assert fsdp.weights == (model.frozen * 2 + model.trained * 4) // 4 + model.largest_block * 2
    assert (fsdp.optimizer, ddp.optimizer) == (model.trained * 8 // 4, model.trained * 8)
    assert ddp.gradients == 2 * single.gradients
    assert (single.activations, fsdp.activations) == (8 * model.activations, 2 * model.activations)
    assert single.steps_per_epoch == 13


def test_the_command_prints_every_phase_and_reads_the_clip_count_from_a_data_set(tmp_path: Path, capsys) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"clips": 40}))
    assert main(["train", "plan", "--sizes", "tiny", "--data", str(tmp_path), "--gpus", "1,2", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2] in "abc"]
    assert [row.split("|")[1:3] for row in rows] == [[f" {phase} ", f" {gpus} "] for phase in "abc" for gpus in (1, 2)]
    assert all(row.rstrip(" |").endswith("| 10") for row in rows)  # 40 clips / 4 a step
    assert main(["train", "plan", "--gpus", "0"]) == 2
    assert main(["train", "phase-a"]) == 2 and "needs --data and --out" in capsys.readouterr().err


def test_the_readmes_plan_table_is_what_the_planner_says(published) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = {line[3]: line for line in readme.splitlines() if line.startswith(("| (a)", "| (b)", "| (c)"))}
    assert sorted(rows) == ["a", "b", "c"]
    for phase, row in rows.items():
        cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
        for cell, gpus in zip(cells, (1, 2, 4, 8), strict=True):
            plan = Plan(published[phase], gpus, 8, "ddp" if gpus == 1 else "fsdp", 1000)
            fits = "/".join(str(size) for size in (24, 48, 80) if plan.fits(size))
            assert cell == f"{plan.total / GIB:.1f} GiB ({fits} GB)", (phase, gpus)
