"""`animegamer train phase-a`: train on a toy-world folder; rerun the same command to resume after a stop.

Runs on one CPU as is and on many GPUs with `accelerate launch -m animegamer train ...`. Phases (b) and (c) follow.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from animegamer.settings import Settings

PHASES = ("phase-a",)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train a phase on a toy-world data set", description=__doc__)
    parser.add_argument("phase", choices=PHASES, help="phase-a: clip encoder + diffusion decoder by reconstruction")
    parser.add_argument("--data", type=Path, required=True, help="a folder written by `animegamer data toyworld`")
    parser.add_argument("--out", type=Path, required=True, help="checkpoint folder; resumed when it holds a state")
    parser.add_argument("--steps", type=_positive, default=None, help="total steps, counted across resumes")
    parser.add_argument("--batch-size", type=_positive, default=None, help="clips per step and process")
    parser.add_argument("--lr", type=float, default=None, help="AdamW learning rate")
    parser.add_argument("--eval-every", type=_non_negative, default=None, help="steps between evaluations (0: off)")
    parser.add_argument("--checkpoint-every", type=_non_negative, default=None, help="steps between saved states")
    parser.add_argument("--vae-steps", type=_non_negative, default=None, help="VAE autoencoder steps (0: random)")
    parser.add_argument("--vae-lr", type=float, default=None, help="the VAE's AdamW learning rate")
    parser.add_argument("--seed", type=int, default=None, help="model init, data order and noise (default 0)")
    parser.add_argument(
        "--model", choices=("toy", "tiny"), default="toy", help="sizes: toy (the shipped model's) or tiny (tests)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from training.config import RECIPE, ToyModelConfig
    from training.dataset import DatasetError
    from training.loop import CheckpointMismatchError
    from training.phase_a import train_phase_a
    from worker.pipeline.config import get_config, toy

    overrides = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "learning_rate": args.lr,
        "eval_every": args.eval_every,
        "checkpoint_every": args.checkpoint_every,
        "seed": args.seed,
        "vae_steps": args.vae_steps,
        "vae_learning_rate": args.vae_lr,
    }
    config = replace(RECIPE[args.phase], **{k: v for k, v in overrides.items() if v is not None})
    model_config = ToyModelConfig(pipeline=toy() if args.model == "toy" else get_config("tiny"))
    try:
        result = train_phase_a(args.data, args.out, config, model_config)
    except (DatasetError, CheckpointMismatchError) as exc:
        print(exc, file=sys.stderr)
        return 1
    last = result.losses.get(result.step)
    evaluated = f", held-out loss {result.eval_losses[max(result.eval_losses)]:.4f}" if result.eval_losses else ""
    loss = f", last loss {last:.4f}" if last is not None else " (already finished)"
    print(f"Phase a at step {result.step}{loss}{evaluated}; saved to {args.out}")
    return 0
