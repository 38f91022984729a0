"""Peak memory and time of one /story recap of a long story: the code before bounded recaps, and now.

    python benchmarks/recap_memory.py [--turns 100] [--limit-bytes 10420224] [--skip-before]

Makes --turns clip files at the published size (720x480, 17 frames, copies of three painted clips
encoded with the worker's settings), then runs each recap in a process of its own and reads that
process's peak resident memory (VmHWM) and its wall time:

- before: the bot's clips.py as of BEFORE_COMMIT, read from git. It re-encoded every frame to join
  (CRF 20), then decoded the joined clip into one frame list and re-encoded it along a ladder of
  up to six CRF/size steps until one fitted the limit.
- after: `bot.recaps.recap_file`: packets copied to join, then at most two re-encodes at a
  bitrate computed from the limit, one frame in memory at a time; then the same call again, which
  finds the kept file and encodes nothing.

The default limit is a server without boosts (10 MiB) less the bot's 64 KiB of room, the usual
case where a long story's recap is re-encoded. Prints each figure and the ratios from this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.bot.clip_samples import FRAMES, story_clips  # noqa: E402

BEFORE_COMMIT = "9084586"  # the last commit with the frame-list recap
DEFAULT_LIMIT = 10 * 1024 * 1024 - 64 * 1024

# Each child prints one JSON line: its output file, seconds, and the kernel's high-water mark of its memory.
PEAK = """
def peak_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
"""
BEFORE = (
    PEAK
    + """
import importlib.util, json, sys, time
from pathlib import Path
folder, turns, limit, module = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
spec = importlib.util.spec_from_file_location("old_clips", module)
clips = sys.modules["old_clips"] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up there
spec.loader.exec_module(clips)
started = time.perf_counter()
paths = [folder / f"job_{turn}.mp4" for turn in range(1, turns + 1)]
data = clips.fit_to_size(clips.join_clips([path.read_bytes() for path in paths]), limit)
out = folder / "before.mp4"
out.write_bytes(data)
print(json.dumps({"path": str(out), "seconds": time.perf_counter() - started, "peak": peak_bytes()}))
"""
)
AFTER = (
    PEAK
    + """
import json, sys, time
from pathlib import Path
from bot.recaps import recap_file
folder, turns, limit = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
clips = [(turn, folder / f"job_{turn}.mp4") for turn in range(1, turns + 1)]
started = time.perf_counter()
path, made = recap_file(folder / "recaps", 1, clips, limit)
print(json.dumps({"path": str(path), "seconds": time.perf_counter() - started, "peak": peak_bytes(), "made": made}))
"""
)


def _run(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the recap process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _frames(path: str) -> int:
    import av

    with av.open(path) as container:
        return sum(1 for _ in container.decode(video=0))


def _show(label: str, result: dict) -> None:
    size = Path(result["path"]).stat().st_size
    print(
        f"{label:<14} peak {result['peak'] / 2**20:7.1f} MiB  time {result['seconds']:7.2f} s  "
        f"clip {size / 2**20:5.2f} MiB, {_frames(result['path'])} frames"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--limit-bytes", type=int, default=DEFAULT_LIMIT)
    parser.add_argument("--skip-before", action="store_true", help="only the current code (the old one takes minutes)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="animegamer-recap-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        paths = story_clips(folder, args.turns)
        joined = sum(path.stat().st_size for path in paths)
        print(
            f"{args.turns} turns of {FRAMES} frames at 720x480: {joined / 2**20:.2f} MiB of clips "
            f"(made in {time.perf_counter() - started:.1f} s), limit {args.limit_bytes / 2**20:.2f} MiB\n"
        )
        argv = (str(folder), str(args.turns), str(args.limit_bytes))
        before = None
        if not args.skip_before:
            module = folder / "old_clips.py"
            source = subprocess.run(
                ["git", "show", f"{BEFORE_COMMIT}:media/clips.py"], cwd=ROOT, capture_output=True, text=True, check=True
            )
            module.write_text(source.stdout)
            before = _run(BEFORE, *argv, str(module))
            _show("before", before)
        after = _run(AFTER, *argv)
        _show("after", after)
        reused = _run(AFTER, *argv)
        assert not reused["made"], "the second recap should have found the kept file"
        _show("after, reused", reused)
        if before is not None:
            print(
                f"\npeak memory before/after: {before['peak'] / after['peak']:.1f}x; "
                f"time before/after: {before['seconds'] / after['seconds']:.1f}x "
                f"(a recap asked for again: {reused['seconds'] * 1000:.0f} ms, nothing encoded)"
            )


if __name__ == "__main__":
    main()
