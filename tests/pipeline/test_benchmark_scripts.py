"""The compute benchmarks run to their end at the tiny sizes on this CPU, so that the first GPU lent to the project
spends its one run measuring, not failing on a script nobody could run before."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import compute_cuts, full_size_turn_cpu, full_turn_gpu
from media.mp4 import decode_mp4

pytestmark = pytest.mark.slow  # whole turns under every cut, several times over (about a minute)


def test_the_gpu_benchmark_prints_every_cut_at_the_tiny_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    full_turn_gpu.main(["--model", "tiny", "--device", "cpu", "--characters", "1"])
    out = capsys.readouterr().out
    for row in [*full_turn_gpu.SAMPLER_CUTS, "flash attention forced", "whole frames", "tiled"]:
        assert row in out, row


def test_the_cut_benchmark_scores_every_cut_against_the_full_compute_clip(capsys: pytest.CaptureFixture[str]) -> None:
    compute_cuts.main(["--model", "tiny", "--turns", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "PSNR" not in line]
    psnr = [float(row.split(" | ")[1]) for row in rows]
    assert len(rows) == len(compute_cuts.cuts_for("tiny"))
    assert psnr[0] >= 35.0, rows  # the VAE's 2D convolutions keep the clip (float rounding only)
    assert min(psnr) < 35.0, rows  # and the table shows a cut that does not (fewer steps, on random weights)


def test_the_full_size_cpu_turn_loads_a_release_tree_and_writes_a_480x720_clip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At the tiny sizes the tree's clip is still the release's 480x720 (the loader reads it from the files). In
    float32: this CPU computes the release's bf16 convolutions so slowly that the tiny VAE's decode alone took 85 s."""
    argv = ["--size", "tiny", "--root", str(tmp_path / "tree"), "--out", str(tmp_path), "--dtype", "float32"]
    full_size_turn_cpu.main(argv)
    out = capsys.readouterr().out
    clip = decode_mp4((tmp_path / "full_size_turn_cpu_tiny.mp4").read_bytes())
    assert clip.shape == (17, 480, 720, 3)
    assert "17 frames of 720x480" in out and "| VAE decode |" in out, out
