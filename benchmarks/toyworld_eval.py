"""How well the trained toy model plays the toy world, against random weights and against itself without history.

    python benchmarks/toyworld_eval.py [--data DIR] [--episodes 40] [--checkpoint PATH] [--num-steps N] [--guidance G]
                                       [--step-cache T] [--seed 0] [--threads N] [--default-only]

Plays held-out episodes turn by turn as the game does (each request carries the last
TOY_HISTORY_WINDOW - 1 turns with the model's own representations and predicted states) and prints
one markdown table: the paper's ACC-S / MAE-S per state value and ACC-F / MAE-F for the clip's
motion scope, per-pixel error against the rendered clip, and the checks a person makes by eye
(training/metrics.py says how each is measured). A "ground truth (rendered)" row scores the
rendered clips after the same MP4 round trip: the ceiling of every clip measure. A "VAE's own reconstruction"
row scores the rendered clips encoded and decoded by the trained model's VAE: the ceiling of any model whose clips
that VAE decodes, so a shortfall it shares is the VAE's, not the MLLM's or the decoder's.

Without --data, a fresh data set is written with a seed the training never used, so every episode
in it is unseen; with --data, only its held-out episodes (training.dataset.split) are played.
The flow and brightness scales are fitted on another fresh set, never on the played episodes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from game.contract import HistoryTurn, TurnRequest
from game.history import past_turns_for
from game.state import StateDeltas
from media.mp4 import encode_mp4
from training import metrics
from training.dataset import Episode, load_toyworld, split, write_toyworld
from training.phase_a import frames_to_tensor
from training.toyworld import CHARACTERS_BY_NAME, CLIP
from worker.pipeline.pipeline import AnimeGamerPipeline
from worker.pipeline.vae import decode_latents

FRESH_CLIPS, FRESH_SEED = 300, 12345  # the default evaluated set: a seed no training run uses
CALIBRATION_CLIPS, CALIBRATION_SEED = 400, 777  # ~7 clips per (action, level) for the flow scale


@dataclass
class Run:
    """One model's (or the ground truth's) turns, in episode order."""

    name: str
    clips: list[list[np.ndarray]] = field(default_factory=list)  # per episode, per turn: (T, H, W, 3) uint8
    deltas: list[StateDeltas] = field(default_factory=list)  # per turn, flattened; empty for the ground truth
    seconds: list[float] = field(default_factory=list)  # per pipeline call


@dataclass(frozen=True)
class Scales:
    flow: metrics.FlowScale
    day_night: metrics.DayNight


def round_trip(clip: np.ndarray) -> np.ndarray:
    """Through H.264 and back, as a model's clip comes: compression adds flow and blurs colours."""
    return metrics.decode_mp4(encode_mp4(clip, CLIP.fps))


def fresh_set(folder: Path, clips: int, seed: int) -> list[Episode]:
    write_toyworld(folder, clips=clips, seed=seed)
    return list(load_toyworld(folder).episodes)


def calibrate(folder: Path) -> Scales:
    """Flow per (action, level) and the day/night threshold, from rendered clips of a separate set."""
    clips, levels, actions, times = [], [], [], []
    for episode in fresh_set(folder, CALIBRATION_CLIPS, CALIBRATION_SEED):
        for clip, record in zip(episode.frames(), episode.clips, strict=True):
            clips.append(round_trip(clip))
            levels.append(record.motion)
            actions.append(record.action)
            times.append(record.time)
    return Scales(metrics.FlowScale.fit(clips, levels, actions), metrics.DayNight.fit(clips, times))


def vae_round_trip(pipe: AnimeGamerPipeline, clip: np.ndarray) -> np.ndarray:
    """``(T, H, W, 3)`` uint8 through the pipeline's VAE (posterior mean) and back, as the game decodes, then MP4."""
    pixels = frames_to_tensor(clip).permute(1, 0, 2, 3)[None]  # (1, 3, T, H, W) in [-1, 1]
    with torch.no_grad():
        latents = pipe.vae.encode(pixels).latent_dist.mean.permute(0, 2, 1, 3, 4)  # (1, F, C, h, w), unscaled
    return round_trip(decode_latents(pipe.vae, latents, scaling_factor=1.0)[0])


def turn_seed(seed: int, episode: Episode, turn: int) -> int:
    """Fixed per (seed, episode, turn), the same for every model and run (Python's hash() is salted)."""
    return zlib.crc32(f"{seed}/{episode.id}/{turn}".encode())


def play(name: str, pipe: AnimeGamerPipeline, episodes: Sequence[Episode], window: int, seed: int) -> Run:
    """Each episode as the game plays it: history is the model's own past representations and states."""
    run = Run(name)
    for number, episode in enumerate(episodes, 1):
        past: list[HistoryTurn] = []
        clips = []
        for turn, record in enumerate(episode.clips):
            request = TurnRequest(
                job_id=f"{episode.id}-{turn}",
                instruction=record.instruction,
                seed=turn_seed(seed, episode, turn),
                history=past_turns_for(past, window),
            )
            started = time.perf_counter()
            result = pipe(request)
            run.seconds.append(time.perf_counter() - started)
            run.deltas.append(result.deltas)
            clips.append(metrics.decode_mp4(result.mp4))
            past.append(
                HistoryTurn(instruction=record.instruction, representation=result.representation, deltas=result.deltas)
            )
        run.clips.append(clips)
        print(f"  {name}: episode {number}/{len(episodes)}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    return run


def _percent(flags: Sequence[bool]) -> str:
    return f"{100 * np.mean(flags):.0f}%" if flags else "—"


def _jumps(jumps: Sequence[float | None]) -> str:
    """Mean jump over the turn pairs where the figure was found in both; how many of them that is."""
    seen = [jump for jump in jumps if jump is not None]
    return f"{statistics.mean(seen):.1f} ({len(seen)} of {len(jumps)})" if seen else f"— (0 of {len(jumps)})"


def score(run: Run, episodes: Sequence[Episode], truth: Sequence[Sequence[np.ndarray]], scales: Scales) -> list[str]:
    """The table's cells for one run, in COLUMNS order."""
    records = [record for episode in episodes for record in episode.clips]
    flows = [metrics.flow_magnitude(clip) for clips in run.clips for clip in clips]
    measured = [scales.flow.level(flow, record.action) for flow, record in zip(flows, records, strict=True)]
    motion = metrics.flow_scores(measured, [record.motion for record in records])
    pairs = [
        pair for clips, rendered in zip(run.clips, truth, strict=True) for pair in zip(clips, rendered, strict=True)
    ]
    pixel = np.mean([metrics.pixel_error(clip, rendered) for clip, rendered in pairs])

    times, moves, lost, found, drifts, jumps = [], [], 0, [], [], []
    for episode, clips in zip(episodes, run.clips, strict=True):
        body = CHARACTERS_BY_NAME[episode.character].body
        for k in range(1, len(clips)):
            if episode.clips[k].place == episode.clips[k - 1].place:  # the figure goes on from where it stopped
                jumps.append(metrics.position_jump(clips[k - 1], clips[k], body))
        for clip, record in zip(clips, episode.clips, strict=True):
            if (right := scales.day_night.time_of_day_right(clip, record.time)) is not None:
                times.append(right)
            if record.action in metrics.MOTION_CHECKS:
                moved = metrics.moves_right_way(record.action, clip, body)
                lost += moved is None
                moves.append(bool(moved))  # no figure, or none at the start or end, fails
        colours = [metrics.figure_colour(clip, body) for clip in clips]
        found += [colour is not None for colour in colours]
        drifts += [drift for drift in metrics.colour_drift(colours) if drift is not None]

    if run.deltas:
        states = metrics.state_scores(run.deltas, [record.deltas for record in records])
        acc_s = "/".join(f"{states[name]['ACC-S']:.2f}" for name in metrics.STATE_NAMES)
        mae_s = "/".join(f"{states[name]['MAE-S']:.2f}" for name in metrics.STATE_NAMES)
    else:
        acc_s = mae_s = "—"
    ratio = metrics.quick_over_gentle(flows, [record.motion for record in records])
    return [
        run.name,
        acc_s,
        mae_s,
        f"{motion['ACC-F']:.2f}",
        f"{motion['MAE-F']:.2f}",
        f"{pixel:.1f}",
        f"{_percent(times)} of {len(times)}",
        f"{_percent(moves)} of {len(moves)}" + (f" ({lost} not found)" if lost else ""),
        f"{ratio:.2f}" if ratio is not None else "—",
        f"{statistics.mean(drifts):.1f}" if drifts else "—",
        _jumps(jumps),
        _percent(found),
        f"{statistics.mean(run.seconds):.2f}" if run.seconds else "—",
    ]


COLUMNS = [
    "model",
    "ACC-S ML/SC/ET/ST ↑",
    "MAE-S ML/SC/ET/ST ↓",
    "ACC-F ↑",
    "MAE-F ↓",
    "pixel MAE ↓",
    "time of day right ↑",
    "moves right way ↑",
    "quick/gentle flow ↑",
    "colour drift ↓",
    "position jump ↓",
    "figure found ↑",
    "s/turn",
]


def load_trained(checkpoint: Path | None, num_steps: int | None) -> tuple[AnimeGamerPipeline, int]:
    """The trained toy model and its history window; imported here, so the rest runs without it."""
    try:
        from worker.pipeline.toy import TOY_HISTORY_WINDOW, ToyCheckpointError, load_toy_pipeline
    except ImportError as exc:
        raise SystemExit(f"The toy model's loader (worker.pipeline.toy) cannot be imported: {exc}") from exc
    try:
        return load_toy_pipeline(checkpoint, device="cpu", num_steps=num_steps), TOY_HISTORY_WINDOW
    except ToyCheckpointError as exc:
        raise SystemExit(
            f"No usable trained toy checkpoint: {exc}\n"
            "Train one with `animegamer train all`, or pass --checkpoint PATH to its model.safetensors."
        ) from exc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="a toy-world folder: its held-out episodes are played")
    parser.add_argument("--episodes", type=int, default=40, help="play at most this many episodes")
    parser.add_argument("--checkpoint", type=Path, help="the trained toy model (default: the shipped file)")
    parser.add_argument("--num-steps", type=int, help="denoising steps (default: the trained model's)")
    parser.add_argument("--guidance", type=float, help="dynamic CFG scale (default: the trained model's; 0: none)")
    parser.add_argument("--step-cache", type=float, help="the step cache's threshold (default: the model's; 0: off)")
    parser.add_argument("--seed", type=int, default=0, help="varies every turn's sampling seed")
    parser.add_argument(
        "--default-only", action="store_true", help="play the default way alone (a compute cut's check, run by seed)"
    )
    parser.add_argument("--threads", type=int, help="torch threads (default torch's; 1 on a shared, busy CPU)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    started = time.perf_counter()
    trained, window = load_trained(args.checkpoint, args.num_steps)
    if args.guidance is not None:
        trained.config = replace(trained.config, sampler=replace(trained.config.sampler, guidance_scale=args.guidance))
    if args.step_cache is not None:
        sampler = replace(trained.config.sampler, step_cache_below=args.step_cache)
        trained.config = replace(trained.config, sampler=sampler)
    config = trained.config  # the random model gets the same sizes and steps
    untrained = AnimeGamerPipeline.random_weights(replace(config, weights_seed=args.seed, label="random weights"))

    with tempfile.TemporaryDirectory(prefix="toyworld-eval-") as tmp:
        if args.data is not None:
            source = f"held-out episodes of {args.data}"
            episodes = list(split(load_toyworld(args.data))[1])
        else:
            source = f"a fresh set ({FRESH_CLIPS} clips, seed {FRESH_SEED}), all unseen"
            episodes = fresh_set(Path(tmp) / "eval", FRESH_CLIPS, FRESH_SEED)
        episodes = episodes[: args.episodes]
        if not episodes:
            raise SystemExit(f"No episodes to play in {source}.")
        rendered = [list(episode.frames()) for episode in episodes]  # read now: the folder goes with tmp
        scales = calibrate(Path(tmp) / "calibration")
    ground = Run("ground truth (rendered)", clips=[[round_trip(clip) for clip in clips] for clips in rendered])
    references = [ground]
    if not args.default_only:
        vae_clips = [[vae_round_trip(trained, clip) for clip in clips] for clips in rendered]
        references.insert(0, Run("the VAE's own reconstruction of the truth", clips=vae_clips))

    runs = [play("trained, no history (the default)", trained, episodes, 1, args.seed)]
    if not args.default_only:
        runs += [
            play(f"trained, own history (window {window})", trained, episodes, window, args.seed),
            play(f"random weights (window {window})", untrained, episodes, window, args.seed),
        ]
    turns = sum(len(episode.clips) for episode in episodes)
    print(
        f"toy world evaluation: {len(episodes)} episodes, {turns} turns from {source}; "
        f"{config.sampler.num_steps} denoising steps, guidance {config.sampler.guidance_scale}, "
        f"step cache {config.sampler.step_cache_below}; "
        f'history window {window} ("no history": 1); '
        f"scales fitted on {CALIBRATION_CLIPS} other rendered clips (seed {CALIBRATION_SEED}); "
        f"seed {args.seed}; torch threads {torch.get_num_threads()}\n"
    )
    rows = [score(run, episodes, rendered, scales) for run in [*runs, *references]]
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(
        "\nML/SC/ET/ST: motion, social, entertainment, stamina. ACC-F/MAE-F: the clip's flow read as a level by "
        "ground truth of the same action. Time of day: day/morning bright, night dark (evening not judged). "
        "Moves right way: flying rises and crosses, walking and running cross, a jump rises, sitting and lying down "
        "end low; a figure not found fails. "
        "Figure found: the body colour in at least half the frames, moving continuously. "
        "Colour drift: RGB distance of the body colour, turn k vs turn 1, where both are found. "
        "Position jump: pixels between the figure at the end of a turn and the start of the next in the same place "
        "(pairs where both are found). "
        f"Whole run {time.perf_counter() - started:.0f} s."
    )


if __name__ == "__main__":
    main()
