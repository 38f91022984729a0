"""Host memory of loading the published model at its full size: the peak resident memory the load adds to its weights.

    python benchmarks/full_size_load.py                      # one character, onto the CPU (and a GPU when present)
    python benchmarks/full_size_load.py --characters 2       # Qiqi and Sosuke on one base (about 21 GB: a GPU host)
    python benchmarks/full_size_load.py --size tiny          # the same script in seconds, to check it runs

Writes a complete tree in the release's layout at the published sizes with random bf16 weights (about 18 GB for one
character; ``tests/checkpoints/release_random.py``, tensor by tensor) under ``--root``, or reuses the one a previous
run finished there. Then loads it through the real loader (``load_release_pipelines``) in a process of its own, once
per device, while this process reads the child's ``/proc/<pid>/status`` every few milliseconds:

- weights: the bytes of every tensor the loaded pipelines hold, each storage counted once, per device;
- peak RSS: the kernel's high-water mark of the child's resident memory (``VmHWM``), and above the weights;
- the same split as the kernel counts it, sampled: anonymous memory (what the process allocated: the weights and
  any copy of them) and file-backed pages (memory-mapped checkpoint files and shared libraries). Mapped file pages
  are clean copies of the disk, dropped first under pressure, but they count in RSS while they stay mapped, and
  a load that keeps a whole checkpoint mapped shows here as a second copy of the weights. Files read through
  ``read()`` instead (and the page cache in general) are not in any process's RSS.
- baseline: the child's resident memory after its imports (and CUDA's start), before the load.

The figure the goal is measured by: peak RSS minus the host weights minus the baseline (under 2 GB: no state dict
beside the model, no whole file kept mapped). Skips, saying why, when the disk or the memory has too little free.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from tests.checkpoints.release_random import TreePlan

GIB = 2**30
DEFAULT_ROOT = ROOT / "out" / "full_size_release"  # out/ is ignored by git
DISK_MARGIN = 2 * GIB
CHILD_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")


def status(pid: int | str = "self") -> dict[str, int]:
    """The memory lines of ``/proc/<pid>/status``, in bytes."""
    found = {}
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            name, _, value = line.partition(":")
            if name in CHILD_FIELDS:
                found[name] = int(value.split()[0]) * 1024
    return found


def mem_available() -> int:
    with open("/proc/meminfo") as lines:
        for line in lines:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# --------------------------------------------------------------------------------------------------------------------
# The child: one load, its figures as one JSON line


def child(root: Path, characters: list[str], device: str) -> None:
    import torch

    from worker.pipeline.checkpoints.load import load_release_pipelines

    if device.startswith("cuda"):
        torch.empty(1, device=device)  # CUDA's context and libraries belong to the baseline, not to the load
    baseline = status()["VmRSS"]
    started = time.perf_counter()
    pipelines = load_release_pipelines(root, characters, device=device, dtype=torch.bfloat16)
    seconds = time.perf_counter() - started

    storages: dict[tuple[str, int], int] = {}  # (device, address) -> bytes: tensors sharing a storage count once
    for pipeline in pipelines.values():
        for value in vars(pipeline).values():
            tensors = []
            if isinstance(value, torch.nn.Module):
                tensors = [*value.parameters(), *value.buffers()]
            elif callable(getattr(value, "tensors", None)):
                tensors = value.tensors()  # SharedMLLM: the base and every character's parts
            for tensor in tensors:
                storage = tensor.untyped_storage()
                storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    weights: dict[str, int] = {}
    for (where, _), nbytes in storages.items():
        kind = torch.device(where).type
        weights[kind] = weights.get(kind, 0) + nbytes
    result = {"seconds": seconds, "baseline": baseline, "weights": weights, "end": status()}
    if device.startswith("cuda"):
        result["gpu_peak"] = torch.cuda.max_memory_allocated()
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------------------------------
# The parent: write the tree, run the children, watch them


@dataclass
class Watched:
    peak_anon: int = 0
    peak_file: int = 0
    peak_rss: int = 0
    killed: str = ""


def run_child(root: Path, characters: list[str], device: str, limit: int, interval: float) -> tuple[dict, Watched]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, __file__, "--child", "--root", str(root), "--device", device, "--names", *characters]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    watched = Watched()
    while process.poll() is None:
        try:
            now = status(process.pid)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            break  # it has just ended
        watched.peak_anon = max(watched.peak_anon, now.get("RssAnon", 0))
        watched.peak_file = max(watched.peak_file, now.get("RssFile", 0))
        watched.peak_rss = max(watched.peak_rss, now.get("VmRSS", 0))
        if now.get("VmRSS", 0) > limit:
            process.send_signal(signal.SIGKILL)
            watched.killed = f"killed at {now['VmRSS'] / GIB:.1f} GiB resident (--max-rss-gib {limit / GIB:g})"
            break
        time.sleep(interval)
    out, _ = process.communicate()
    if watched.killed:
        return {}, watched
    if process.returncode:
        raise SystemExit(f"the {device} load failed (exit {process.returncode}); its error is above")
    return json.loads(out.strip().splitlines()[-1]), watched


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def prepare_tree(root: Path, plan: TreePlan, characters: Sequence[str]) -> bool:
    """The release-layout tree of ``plan`` under ``root``: reused when a run finished it for these sizes, else
    written. False, having said why, when the disk has too little free for it."""
    from tests.checkpoints.release_random import COMPLETE, write_random_release

    root.mkdir(parents=True, exist_ok=True)
    complete = (root / COMPLETE).is_file() and json.loads((root / COMPLETE).read_text()) == plan.describe()
    free = shutil.disk_usage(root).free
    if not complete and free < plan.total_bytes + DISK_MARGIN:
        print(
            f"SKIPPED: the tree needs {_gib(plan.total_bytes)} GiB and {root} has {_gib(free)} GiB free "
            f"(and {_gib(DISK_MARGIN)} GiB kept spare); free some or pass --root on a larger disk"
        )
        return False
    started = time.perf_counter()
    wrote = write_random_release(root, plan)
    on_disk = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    how = f"written in {time.perf_counter() - started:.0f} s" if wrote else "reused from an earlier run"
    print(f"tree: {root}, {_gib(on_disk)} GiB on disk, {', '.join(characters)}, {how}")
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="where the tree is written (reused)")
    parser.add_argument("--characters", type=int, default=1, choices=(1, 2), help="2 needs about 21 GB of weights")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--device", action="append", help="cpu, cuda (default: cpu, and cuda when there is one)")
    parser.add_argument("--max-rss-gib", type=float, default=20.0, help="kill a load that grows beyond this")
    parser.add_argument("--interval", type=float, default=0.005, help="seconds between two samples of the child")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--names", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.root, args.names, args.device[0])
        return

    import torch

    from tests.checkpoints.release_random import plan_tree, tiny_plan
    from worker.pipeline.checkpoints.layout import CHARACTERS
    from worker.pipeline.config import full, tiny

    characters = CHARACTERS[: args.characters]
    plan = plan_tree(full(), characters) if args.size == "full" else tiny_plan(tiny(), characters)
    devices = args.device or ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]

    # 1. The tree: reused when a run finished it for these sizes, else written (skipped when the disk is too full)
    if not prepare_tree(args.root, plan, characters):
        return

    # 2. One load per device, in a child process each
    rows = []
    for device in devices:
        if device == "cpu" and mem_available() < plan.total_bytes + GIB:
            print(
                f"SKIPPED cpu: the weights need about {_gib(plan.total_bytes)} GiB and this machine has "
                f"{_gib(mem_available())} GiB available; try --characters 1 or a larger machine"
            )
            continue
        result, watched = run_child(args.root, list(characters), device, int(args.max_rss_gib * GIB), args.interval)
        if watched.killed:
            print(f"{device}: {watched.killed}")
            continue
        rows.append((device, result, watched))

    # 3. The table
    print()
    print(
        "| device | load s | host weights GiB | GPU weights GiB | baseline GiB | peak RSS GiB | above weights "
        "| above weights + baseline | peak anon GiB | peak file-mapped GiB | GPU peak allocated GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for device, result, watched in rows:
        host = result["weights"].get("cpu", 0)
        gpu = sum(v for k, v in result["weights"].items() if k != "cpu")
        peak = result["end"]["VmHWM"]
        print(
            f"| {device} | {result['seconds']:.0f} | {_gib(host)} | {_gib(gpu)} | {_gib(result['baseline'])} "
            f"| {_gib(peak)} | {_gib(peak - host)} | {_gib(peak - host - result['baseline'])} "
            f"| {_gib(watched.peak_anon)} | {_gib(watched.peak_file)} "
            f"| {_gib(result['gpu_peak']) if 'gpu_peak' in result else '-'} |"
        )


if __name__ == "__main__":
    main()
