"""`animegamer train phase-a|phase-b|phase-c|all`: train on a toy-world folder; rerun the same command to resume.
`animegamer train character`: a character of your own from `animegamer data prepare`'s folder, over a published one,
written beside it in the release's layout; rerun the same command to resume.
`animegamer train plan`: the memory each phase needs per GPU at the chosen sizes, batch and GPU count.

``--out`` is the run's folder: phase X works in ``OUT/phase_x`` and reads the earlier phases from there, and ``all``
ends by writing ``OUT/model.safetensors``, the file ``ANIMEGAMER_MODEL=toy`` loads. Runs on one CPU as is and on
many GPUs with `accelerate launch -m animegamer train ...`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from animegamer.cli.arguments import non_negative, positive
from relay.settings import Settings

if TYPE_CHECKING:  # training imports torch: only when a command runs
    from training.config import ToyModelConfig, TrainConfig
    from training.loop import TrainResult

PHASES = ("phase-a", "phase-b", "phase-c", "all", "character", "plan")
HELP = (
    "phase-a: clip encoder + VAE + diffusion decoder by reconstruction; phase-b: the MLLM predicts representations "
    "and states; phase-c: the decoder adapts to the MLLM's predictions (left out of all: training.config.PHASE_C); "
    "all: phases a and b, then the model file; character: your own character's three phases on the published "
    "architecture; plan: memory per GPU for each phase, trains nothing"
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train the toy-world model's phases", description=__doc__)
    parser.add_argument("phase", choices=PHASES, help=HELP)
    parser.add_argument(
        "--data", type=Path, help="a folder written by `animegamer data toyworld` (`data prepare` for character)"
    )
    parser.add_argument("--out", type=Path, help="the run's folder; resumed when it holds states (required to train)")
    parser.add_argument(
        "--model", choices=("toy", "tiny"), default="toy", help="sizes: toy (the shipped model's) or tiny (tests)"
    )
    single = parser.add_argument_group(
        "one phase's schedule (default: training.config.RECIPE); for character, --batch-size, --lr, "
        "--checkpoint-every and --seed set all three phases' (default: training.character_run.CharacterSchedule)"
    )
    single.add_argument("--steps", type=positive, default=None, help="total steps, counted across resumes")
    single.add_argument("--batch-size", type=positive, default=None, help="clips per step and process")
    single.add_argument("--lr", type=float, default=None, help="AdamW learning rate")
    single.add_argument("--eval-every", type=non_negative, default=None, help="steps between evaluations (0: off)")
    single.add_argument("--checkpoint-every", type=non_negative, default=None, help="steps between saved states")
    single.add_argument("--vae-steps", type=non_negative, default=None, help="phase a: VAE steps (0: random)")
    single.add_argument("--vae-lr", type=float, default=None, help="phase a: the VAE's AdamW learning rate")
    single.add_argument(
        "--own-history", type=float, default=None, help="phase b: share of steps on its own past predictions"
    )
    single.add_argument(
        "--figure-weight", type=float, default=None, help="the character's latent cells weigh 1 + this in the loss"
    )
    single.add_argument("--seed", type=int, default=None, help="model init, data order and noise (default 0)")
    own = parser.add_argument_group("character (training.character_run)")
    own.add_argument("--name", help="the new character's name, as players will pick it")
    own.add_argument("--base", default="Qiqi", help="the published character it starts from (default Qiqi)")
    own.add_argument("--checkpoints", type=Path, default=None, help="the release's tree (default: settings')")
    own.add_argument("--phase-steps", default=None, help="steps of phases a,b,c, like 400,400,200 (the default)")
    own.add_argument("--device", default=None, help="torch device (default: cuda when there is one)")
    plan = parser.add_argument_group("plan (training.plan)")
    plan.add_argument("--sizes", choices=("full", "toy", "tiny"), default="full", help="model sizes (default full)")
    plan.add_argument("--batch", type=positive, default=8, help="global batch: samples per optimizer step")
    plan.add_argument("--gpus", default="1,2,4,8", help="GPU counts, comma-separated (default 1,2,4,8)")
    plan.add_argument("--gpu-memory", default="24,48,80", help="GPU sizes in GB to check (default 24,48,80)")
    plan.add_argument("--sharding", choices=("auto", "ddp", "fsdp"), default="auto", help="auto: DDP on one GPU")
    plan.add_argument("--history", type=positive, default=5, help="phase b: turns in a window (default 5)")
    plan.add_argument("--clips", type=positive, default=None, help="clips in the data set (default: --data's)")
    parser.set_defaults(run=run)


def run_plan(args: argparse.Namespace) -> int:
    import json

    from training.plan import table
    from worker.pipeline.config import get_config, toy

    try:
        gpus = [int(part) for part in args.gpus.split(",")]
        sizes = [float(part) for part in args.gpu_memory.split(",")]
        if min(gpus) < 1 or min(sizes) <= 0:
            raise ValueError
    except ValueError:
        print("--gpus and --gpu-memory take positive numbers, comma-separated, like 1,2,4,8", file=sys.stderr)
        return 2
    clips = args.clips
    if clips is None and args.data is not None:
        try:
            clips = json.loads((args.data / "manifest.json").read_text())["clips"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"{args.data}/manifest.json cannot be read ({exc}); give --clips", file=sys.stderr)
            return 1
    config = toy() if args.sizes == "toy" else get_config(args.sizes)
    print(table(config, args.batch, gpus, sizes, args.sharding, args.history, clips or 1000))
    return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.phase == "plan":
        return run_plan(args)
    if args.data is None or args.out is None:
        print(f"`train {args.phase}` needs --data and --out", file=sys.stderr)
        return 2
    if args.phase == "character":
        return run_character(args, settings)
    from training.config import PHASE_C, RECIPE, ToyModelConfig
    from training.dataset import DatasetError
    from training.loop import CheckpointMismatchError
    from training.phase_b import PhaseError
    from training.toyworld import vocabulary
    from worker.pipeline.config import get_config, toy

    sizes = ToyModelConfig(pipeline=toy() if args.model == "toy" else get_config("tiny"))
    model_config = sizes.reading_words(vocabulary())
    overrides = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "learning_rate": args.lr,
        "eval_every": args.eval_every,
        "checkpoint_every": args.checkpoint_every,
        "seed": args.seed,
        "vae_steps": args.vae_steps,
        "vae_learning_rate": args.vae_lr,
        "own_history": args.own_history,
        "figure_weight": args.figure_weight,
    }
    chosen = {k: v for k, v in overrides.items() if v is not None}
    if args.phase == "all" and chosen:
        print("`train all` runs training.config.RECIPE; schedule flags apply to one phase only.", file=sys.stderr)
        return 2
    try:
        if args.phase == "all":
            return _all(args, model_config)
        config = replace({**RECIPE, "phase-c": PHASE_C}[args.phase], **chosen)
        result = _one(args, config, model_config)
    except (DatasetError, CheckpointMismatchError, PhaseError) as exc:
        print(exc, file=sys.stderr)
        return 1
    last = result.losses.get(result.step)
    evaluated = f", held-out loss {result.eval_losses[max(result.eval_losses)]:.4f}" if result.eval_losses else ""
    loss = f", last loss {last:.4f}" if last is not None else " (already finished)"
    name = args.phase.replace("-", " ").capitalize()
    print(f"{name} at step {result.step}{loss}{evaluated}; saved to {args.out / args.phase.replace('-', '_')}")
    return 0


def _one(args: argparse.Namespace, config: TrainConfig, model_config: ToyModelConfig) -> TrainResult:
    from training.phase_a import train_phase_a
    from training.phase_b import train_phase_b
    from training.phase_c import train_phase_c

    a, b, c = (args.out / name for name in ("phase_a", "phase_b", "phase_c"))
    if args.phase == "phase-a":
        return train_phase_a(args.data, a, config, model_config)
    if args.phase == "phase-b":
        return train_phase_b(args.data, b, a, config, model_config)
    return train_phase_c(args.data, c, a, b, config, model_config)


def _all(args: argparse.Namespace, model_config: ToyModelConfig) -> int:
    from training.run_all import train_all

    result = train_all(args.data, args.out, model_config=model_config)
    for phase, seconds in result.seconds.items():
        held_out = f", held-out loss {result.held_out[phase]:.4f}" if phase in result.held_out else ""
        print(f"{phase}: step {result.steps[phase]} in {seconds / 60:.1f} min{held_out}")
    print(f"Wrote {result.model}; copy it to worker/pipeline/toy_weights/toyworld.safetensors to make it the default")
    return 0


def run_character(args: argparse.Namespace, settings: Settings) -> int:
    from training.character_run import CharacterSchedule, train_character
    from training.dataset import DatasetError
    from training.loop import CheckpointMismatchError
    from worker.pipeline.checkpoints.errors import CheckpointError

    if not args.name:
        print("`train character` needs --name, the new character's name", file=sys.stderr)
        return 2
    schedule = CharacterSchedule()
    phases = {"a": schedule.a, "b": schedule.b, "c": schedule.c}
    if args.phase_steps is not None:
        try:
            steps = [int(part) for part in args.phase_steps.split(",")]
            if len(steps) != 3 or min(steps) < 1:
                raise ValueError
        except ValueError:
            print("--phase-steps takes three positive numbers, like 400,400,200", file=sys.stderr)
            return 2
        phases = {phase: replace(config, steps=n) for (phase, config), n in zip(phases.items(), steps, strict=True)}
    chosen = {
        key: value
        for key, value in (
            ("batch_size", args.batch_size),
            ("learning_rate", args.lr),
            ("checkpoint_every", args.checkpoint_every),
            ("seed", args.seed),
        )
        if value is not None
    }
    schedule = CharacterSchedule(**{phase: replace(config, **chosen) for phase, config in phases.items()})
    root = args.checkpoints or settings.checkpoints
    try:
        result = train_character(
            args.data, root, args.name, args.out, base=args.base, schedule=schedule, device=args.device, on_stage=print
        )
    except (DatasetError, CheckpointError, CheckpointMismatchError) as exc:
        print(exc, file=sys.stderr)
        return 1
    for phase, step in result.steps.items():
        losses = result.losses[phase]
        last = f", last loss {losses[max(losses)]:.4f}" if losses else " (already finished)"
        print(f"phase ({phase}): step {step}{last}")
    print(f"{args.name} is ready: serve it with ANIMEGAMER_CHARACTERS including {args.name} and checkpoints {root}")
    return 0
