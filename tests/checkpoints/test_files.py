"""Reading checkpoint files: what a memory-mapped read leaves resident, and that handing it back loses nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from worker.pipeline.checkpoints.files import drop_mapped_pages, load_torch_file

MIB = 2**20


def _rss_file() -> int:
    """This process's resident pages of mapped files (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status; madvise is Linux's")
def test_dropping_a_files_pages_frees_them_and_keeps_its_values(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.arange(16 * MIB, dtype=torch.float32)}, path)  # 64 MiB
    state = load_torch_file(path)
    before = _rss_file()
    total = float(state["w"].sum(dtype=torch.float64))  # reads every page of the mapping
    read = _rss_file()
    drop_mapped_pages(path)
    dropped = _rss_file()

    assert read - before > 48 * MIB
    assert read - dropped > 48 * MIB
    assert float(state["w"].sum(dtype=torch.float64)) == total  # read again, from the file


def test_dropping_pages_of_a_file_not_mapped_does_nothing(tmp_path: Path) -> None:
    kept = torch.ones(MIB)
    assert drop_mapped_pages(tmp_path / "nothing.pt") == 0
    assert drop_mapped_pages("<state dict>") == 0
    assert float(kept.sum()) == MIB
