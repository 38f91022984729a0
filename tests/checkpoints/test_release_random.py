"""The random-weight tree writer of benchmarks/full_size_load.py agrees with the loader, checked at tiny sizes."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest
import torch

from benchmarks import full_size_load
from tests.checkpoints import release_random
from tests.checkpoints.release_random import COMPLETE, plan_tree, tiny_plan, write_random_release
from worker.pipeline.checkpoints.load import load_release_pipelines
from worker.pipeline.config import full, tiny

MISTRAL_7B_PARAMETERS = 7_241_732_096  # Mistral-7B-v0.1, as its model card counts them


def test_a_tiny_random_tree_loads_at_the_sizes_it_was_planned_for(tmp_path: Path) -> None:
    plan = tiny_plan(tiny(), ("Qiqi", "Sosuke"))
    write_random_release(tmp_path, plan, shard_bytes=20_000)  # several shards and their index
    assert len(list((tmp_path / "Mistral-7B-Instruct-v0.1").glob("*.safetensors"))) > 1

    pipelines = load_release_pipelines(tmp_path, ("Qiqi", "Sosuke"), device="cpu", dtype=torch.bfloat16)

    pipe = pipelines["Sosuke"]
    assert pipe.config.mllm == plan.config.mllm
    assert pipe.config.decoder == plan.config.decoder
    assert pipe.config.vae.block_out_channels == plan.config.vae.block_out_channels
    assert all(torch.isfinite(p).all() for p in pipe.decoder.parameters())


def test_a_finished_tree_is_reused_and_one_of_other_sizes_rewritten(tmp_path: Path) -> None:
    one = tiny_plan(tiny(), ("Qiqi",))
    assert write_random_release(tmp_path, one)
    assert not write_random_release(tmp_path, one)
    assert write_random_release(tmp_path, tiny_plan(tiny(), ("Qiqi", "Sosuke")))


def test_the_full_size_tree_holds_mistral_7b_and_the_published_parts() -> None:
    plan = plan_tree(full(), ("Qiqi",))  # shapes only: nothing is written or allocated
    parameters = {part: plan.bytes_of(getattr(plan, part)) // 2 for part in ("base", "mllm", "decoder", "vae")}
    assert parameters["base"] == MISTRAL_7B_PARAMETERS
    assert 1.65e9 < parameters["decoder"] < 1.75e9  # CogVideoX-2B's DiT and the LoRA factors
    assert 0.2e9 < parameters["vae"] < 0.25e9
    assert 17 * 2**30 < plan.total_bytes < 19 * 2**30


def _must_not_write(*args: object, **kwargs: object) -> bool:
    raise AssertionError("the benchmark began writing 18 GB on a disk it found too full")


def test_the_benchmark_skips_naming_the_space_when_the_disk_is_too_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(full_size_load.shutil, "disk_usage", lambda _: usage(10**12, 10**12, 10**9))
    monkeypatch.setattr(release_random, "write_random_release", _must_not_write)
    full_size_load.main(["--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("SKIPPED: the tree needs 1") and "0.93 GiB free" in out
    assert not (tmp_path / COMPLETE).exists()
