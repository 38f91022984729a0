"""Does the toy model's VAE keep the figure? Reconstruct unseen clips and look for the character.

    python benchmarks/toyworld_vae.py [--checkpoint PATH] [--clips 57] [--threads N]
    python benchmarks/toyworld_vae.py --train DATA --steps 400 [--latent-channels 16] [--lr 2e-3] [--out DIR]

The first form measures a model file's VAE (default: the shipped one); the second trains a VAE stage of another
size or schedule on a `animegamer data toyworld` folder first, the way phase (a) does, and measures that. Each
unseen clip (the evaluation's set, a seed training never used) goes through the VAE's encoder (posterior mean) and
decoder; the line printed says in how many reconstructions the character is still found (``metrics.is_figure``:
its body colour, most frames, moving continuously), and the per-pixel error.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training import metrics  # noqa: E402
from training.config import RECIPE, ToyModelConfig  # noqa: E402
from training.dataset import Episode, load_toyworld, split, write_toyworld  # noqa: E402
from training.phase_a import ClipSet, FrameSet, frames_to_tensor, train_vae  # noqa: E402
from worker.pipeline.config import toy  # noqa: E402
from worker.pipeline.toy import SHIPPED, read_toy_checkpoint  # noqa: E402
from worker.pipeline.vae import build_vae  # noqa: E402

FRESH_CLIPS, FRESH_SEED = 300, 12345  # the same unseen set as toyworld_eval.py


@torch.no_grad()
def reconstruct(vae: nn.Module, frames: np.ndarray) -> np.ndarray:
    """uint8 `(T, H, W, 3)` -> the VAE's reconstruction, same shape."""
    x = frames_to_tensor(frames)[None].permute(0, 2, 1, 3, 4)  # (1, 3, T, H, W)
    out = vae.decode(vae.encode(x).latent_dist.mean).sample[0]  # (3, T, H, W) in [-1, 1]
    return ((out.permute(1, 2, 3, 0).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()


def measure(vae: nn.Module, episodes: list[Episode], clips: int) -> tuple[int, int, float]:
    kept = seen = 0
    errors = []
    for episode in episodes:
        for frames in episode.frames():
            if seen == clips:
                return kept, seen, float(np.mean(errors))
            rebuilt = reconstruct(vae, frames)
            kept += metrics.is_figure(metrics.figure_track(rebuilt, episode.world.character.body))
            seen += 1
            errors.append(metrics.pixel_error(rebuilt, frames))
    return kept, seen, float(np.mean(errors))


def trained_variant(args: argparse.Namespace) -> tuple[nn.Module, str]:
    base = toy()
    channels = args.latent_channels or base.vae.latent_channels
    pipeline = replace(
        base,
        vae=replace(base.vae, latent_channels=channels),
        decoder=replace(base.decoder, latent_channels=channels),
    )
    model_config = ToyModelConfig(pipeline=pipeline)
    recipe = RECIPE["phase-a"]
    config = replace(
        recipe,
        vae_steps=args.steps,
        vae_learning_rate=args.lr or recipe.vae_learning_rate,
        lr_decay=recipe.lr_decay if args.lr_decay is None else args.lr_decay,
        vae_figure_weight=recipe.vae_figure_weight if args.figure_weight is None else args.figure_weight,
    )
    training, _ = split(load_toyworld(args.train), config.held_out_every)
    frames = ClipSet(training).frame_set()
    started = time.perf_counter()
    vae, _ = train_vae(frames, FrameSet(frames.frames[:0], frames.figure[:0]), config, model_config, args.out)
    minutes = (time.perf_counter() - started) / 60
    return (
        vae,
        f"VAE trained here: {args.steps} steps, lr {config.vae_learning_rate} (decay {config.lr_decay}), "
        f"{channels} channels, "
        f"figure weight {config.vae_figure_weight}, {minutes:.1f} min",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a toy model file (default: the shipped one)")
    parser.add_argument("--clips", type=int, default=57)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--train", type=Path, help="train a VAE stage on this toyworld folder instead")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--latent-channels", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--lr-decay", type=float, help="share of the steps the rate falls over (default: recipe)")
    parser.add_argument("--figure-weight", type=float, help="the character's pixels weigh 1 + this (default: recipe)")
    parser.add_argument("--out", type=Path, default=Path("runs/vae_variant"), help="the variant's resumable state")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.train:
        vae, what = trained_variant(args)
    else:
        path = args.checkpoint or SHIPPED
        config, parts, _ = read_toy_checkpoint(path)
        vae = build_vae(config.vae).eval()
        vae.load_state_dict(parts["vae"])
        what = f"VAE of {path.name}"
    with tempfile.TemporaryDirectory() as tmp:
        write_toyworld(Path(tmp) / "eval", clips=FRESH_CLIPS, seed=FRESH_SEED)
        kept, seen, error = measure(vae.eval(), list(load_toyworld(Path(tmp) / "eval").episodes), args.clips)
    print(f"{what}: figure kept in {kept} of {seen} unseen clips ({100 * kept / seen:.0f}%), pixel MAE {error:.1f}")


if __name__ == "__main__":
    main()
