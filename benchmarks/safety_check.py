"""What the nudity detector costs a turn, and what it says of the frames this project makes.

    python benchmarks/safety_check.py [--toy-turns 8] [--tiny-turns 2] [--episodes 4]

The frames: the demo story's instructions as the toy model plays them, turns of the tiny (random-weight) model and
clips of the procedurally drawn toy world. Prints, for each source, its frames, the highest unsafe score and how
many frames reach the default threshold (false positives: none of these frames shows nudity), then the detector's
seconds per 17-frame clip at the tiny sizes and at the published 480x720 beside a toy turn's seconds measured in the
same run (the ratio). The published turn itself is not run here (963 s on this CPU for two steps, docs/measurements.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from game.contract import TurnRequest  # noqa: E402
from game.instruction import parse  # noqa: E402
from game.safety import DEFAULT_THRESHOLD, UNSAFE_LABELS  # noqa: E402
from worker.safety import LABELS, NudeNetChecker  # noqa: E402

UNSAFE = [LABELS.index(label) for label in sorted(UNSAFE_LABELS)]


def demo_lines() -> list[str]:
    text = (REPO / "game" / "data" / "demo.txt").read_text()
    return [str(parse(line)) for line in text.splitlines() if line.strip()]


def model_frames(model: str, turns: int) -> tuple[list[np.ndarray], float]:
    """``turns`` clips of the demo story by ``model`` (frames before the MP4 encoder), and seconds per turn."""
    from worker.pipeline.loading import load_pipeline

    pipeline = load_pipeline(model, device="cpu")
    lines = demo_lines()
    clips, started = [], time.perf_counter()
    for turn in range(turns):
        request = TurnRequest(job_id=f"safety-{turn}", instruction=lines[turn % len(lines)], seed=turn + 1)
        clips.append(pipeline.render(request).frames)
    return clips, (time.perf_counter() - started) / max(turns, 1)


def toyworld_frames(episodes: int, turns: int = 4) -> list[np.ndarray]:
    """Clips of the toy world the toy model was trained on, drawn by its own renderer."""
    from training.toyworld import plan_episode, render_clip

    clips = []
    for episode in range(episodes):
        rng = np.random.default_rng(episode)
        world, planned = plan_episode(rng, turns)
        clips += [render_clip(turn, world, rng) for turn in planned]
    return clips


def project_frames(toy_turns: int = 8, tiny_turns: int = 2, episodes: int = 4) -> dict[str, list[np.ndarray]]:
    toy, _ = model_frames("toy", toy_turns)
    tiny, _ = model_frames("tiny", tiny_turns)
    return {"toy model, demo story": toy, "tiny model, random weights": tiny, "toy world": toyworld_frames(episodes)}


def unsafe_scores(checker: NudeNetChecker, clips: list[np.ndarray]) -> np.ndarray:
    """The highest unsafe score of every frame of ``clips``: ``(frames,)``."""
    return np.concatenate([checker.scores(clip)[:, UNSAFE].max(axis=1) for clip in clips])


def seconds_per_clip(checker: NudeNetChecker, clip: np.ndarray, repeats: int = 5) -> float:
    checker(clip)  # warm
    started = time.perf_counter()
    for _ in range(repeats):
        checker(clip)
    return (time.perf_counter() - started) / repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--toy-turns", type=int, default=8)
    parser.add_argument("--tiny-turns", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    args = parser.parse_args(argv)

    import torch

    checker = NudeNetChecker.load(threads=torch.get_num_threads())
    print(f"detector: {checker.name}, threshold {args.threshold}, {torch.get_num_threads()} thread(s)")
    toy, toy_turn = model_frames("toy", args.toy_turns)
    tiny, _ = model_frames("tiny", args.tiny_turns)
    sources = {
        "toy model, demo story": toy,
        "tiny model, random weights": tiny,
        "toy world": toyworld_frames(args.episodes),
    }

    print("| frames of | frames | highest unsafe score | flagged |")
    print("|---|---|---|---|")
    every = []
    for name, clips in sources.items():
        scores = unsafe_scores(checker, clips)
        every.append(scores)
        print(f"| {name} | {len(scores)} | {scores.max():.4f} | {int((scores >= args.threshold).sum())} |")
    scores = np.concatenate(every)
    print(f"false positives: {int((scores >= args.threshold).sum())} of {len(scores)} frames")
    sweep = ", ".join(f"{int((scores >= t).sum())} at {t}" for t in (0.1, 0.2, 0.3, 0.4, 0.5))
    print(f"frames flagged at other thresholds: {sweep}")

    small = toy[0]  # (17, 64, 96, 3)
    large = np.ascontiguousarray(np.repeat(np.repeat(small, 8, axis=1), 8, axis=2)[:, :480, :720])  # (17, 480, 720, 3)
    at_small, at_large = seconds_per_clip(checker, small), seconds_per_clip(checker, large)
    print(
        f"detector per {len(small)}-frame clip: {at_small:.3f} s at {small.shape[1]}x{small.shape[2]}, "
        f"{at_large:.3f} s at 480x720"
    )
    print(f"toy turn (MLLM, denoising, VAE): {toy_turn:.3f} s; the detector adds {at_small / toy_turn:.2f}x of it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
