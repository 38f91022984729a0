"""Can phase (a)'s decoder draw the character when it is told exactly what the clip is?

    python benchmarks/toyworld_decoder.py --run RUN [--model RUN/model.safetensors] [--clips 24] [--shift 3.0]
                                          [--guidance 0] [--threads N]

Phase (a) trains the clip encoder and the diffusion decoder together: the encoder's representation of a true clip is
the best condition the decoder can ever get, better than any the MLLM predicts. So if the decoder cannot draw the
figure from it, no training of the MLLM will put the figure into the game's clips. For each unseen clip (the
evaluation's set, a seed training never used) this encodes the true clip (its VAE latents, then the encoder), samples
latents from that representation with the game's sampler (DPM-Solver++ SDE, 50 steps, no guidance by default: phase
(a) never trains the unconditional tokens), decodes them with the run's VAE, and prints in how many the character is
found (``metrics.is_figure``), the per-pixel error and the motion measures of ``toyworld_eval.py`` (moves the right
way, quick / gentle flow), beside the VAE's own reconstruction of the same clips and the rendered truth. With
``--model`` (the run's ``model.safetensors``) it adds the rows that say where the game's clips lose what these keep:
the phase-(c) decoder told the true clip, and each decoder given the MLLM's own prediction of the turn (from the
instruction alone, as a game's first turn).

The decoder's sizes come from the run's ``phase_a/phase_a.json``; ``--shift`` must be the noise schedule's SNR
shift the run trained with.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from safetensors.torch import load as load_safetensors  # noqa: E402

from game.contract import TurnRequest  # noqa: E402
from game.motion import flow_for  # noqa: E402
from media.mp4 import encode_mp4  # noqa: E402
from training import metrics  # noqa: E402
from training.config import ToyModelConfig  # noqa: E402
from training.dataset import load_toyworld, write_toyworld  # noqa: E402
from training.encoder import ClipEncoder, instruction_bytes  # noqa: E402
from training.phase_a import encode_latents, frames_to_tensor  # noqa: E402
from training.toyworld import CLIP  # noqa: E402
from worker.pipeline.config import DecoderConfig, PipelineConfig, toy  # noqa: E402
from worker.pipeline.decoder import AnimeGamerDecoder  # noqa: E402
from worker.pipeline.pipeline import REPRESENTATION_KEY  # noqa: E402
from worker.pipeline.sampler import DPMSolverSDESampler  # noqa: E402
from worker.pipeline.toy import load_toy_pipeline  # noqa: E402
from worker.pipeline.vae import build_vae  # noqa: E402

FRESH_CLIPS, FRESH_SEED = 300, 12345  # the same unseen set as toyworld_eval.py


def run_config(phase_a: Path, shift: float, guidance: float) -> tuple[PipelineConfig, float]:
    """The toy pipeline with the decoder sizes the run recorded, and the run's latent scale."""
    meta = json.loads((phase_a / "phase_a.json").read_text())
    sizes = {k.removeprefix("decoder."): v for k, v in meta["sizes"].items() if k.startswith("decoder.")}
    base = toy()
    pipeline = replace(
        base,
        decoder=DecoderConfig(**sizes),
        sampler=replace(base.sampler, shift_scale=shift, guidance_scale=guidance),
    )
    return pipeline, float(meta["scaling_factor"])


def sample(
    decoder: AnimeGamerDecoder,
    sampler: DPMSolverSDESampler,
    condition: torch.Tensor,
    flow: torch.Tensor,
    noise: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Latents `(1, F, C, h, w)` from the [unconditional; conditional] pair `(2, 226, D)`, as the game samples."""

    def predict_v(z: torch.Tensor, t: int, step: int) -> torch.Tensor:
        v_uncond, v_cond = decoder(torch.cat([z, z]), torch.full((2,), t), condition, flow).float().chunk(2)
        return v_uncond + sampler.guidance(step) * (v_cond - v_uncond)

    return sampler.sample(predict_v, noise, generator)


def to_frames(pixels: torch.Tensor) -> np.ndarray:
    """VAE output `(3, T, H, W)` in [-1, 1] -> uint8 `(T, H, W, 3)`."""
    return ((pixels.permute(1, 2, 3, 0).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a `train` run folder with a finished phase_a/")
    parser.add_argument("--model", type=Path, help="the run's model file: adds its MLLM's and phase (c)'s rows")
    parser.add_argument("--clips", type=int, default=24)
    parser.add_argument("--shift", type=float, default=toy().sampler.shift_scale, help="the run's SNR shift")
    parser.add_argument("--guidance", type=float, default=0.0, help="dynamic CFG scale (0: none)")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()

    phase_a = args.run / "phase_a"
    pipeline, scale = run_config(phase_a, args.shift, args.guidance)
    model_config = ToyModelConfig(pipeline=pipeline)
    encoder, decoder = ClipEncoder(model_config).eval(), AnimeGamerDecoder.from_pipeline_config(pipeline.decoder)
    vae = build_vae(pipeline.vae).eval()
    for module, name in ((encoder, "encoder.pt"), (decoder, "decoder.pt"), (vae, "vae.pt")):
        module.load_state_dict(torch.load(phase_a / name, weights_only=True))
    decoder.eval()
    game = load_toy_pipeline(args.model) if args.model else None  # its MLLM and its phase-(c) decoder

    with tempfile.TemporaryDirectory() as tmp:
        write_toyworld(Path(tmp) / "eval", clips=FRESH_CLIPS, seed=FRESH_SEED)
        episodes = load_toyworld(Path(tmp) / "eval").episodes
        unseen = [(ep, clip, frames) for ep in episodes for clip, frames in zip(ep.clips, ep.frames(), strict=True)]
    unseen = unseen[: args.clips]

    rows: dict[str, Row] = {}
    shape = (1, pipeline.latent_frames, pipeline.decoder.latent_channels, pipeline.latent_height, pipeline.latent_width)
    with torch.no_grad():
        for index, (episode, clip, frames) in enumerate(unseen):
            x = frames_to_tensor(frames)[None]  # (1, T, 3, H, W)
            latents_true = encode_latents(vae, x, scale)  # (1, F, C, h, w), as phase (a) trained on them
            true = encoder(latents_true, instruction_bytes([clip.instruction], model_config.max_instruction_bytes))
            flow = torch.full((2,), flow_for(clip.motion))

            def decoded(
                by: AnimeGamerDecoder, condition: torch.Tensor, seed: int = index, flow: torch.Tensor = flow
            ) -> np.ndarray:
                generator = torch.Generator().manual_seed(seed)
                noise = torch.randn(shape, generator=generator)
                pair = torch.cat([by.unconditional_tokens(1), condition])
                latents = sample(by, DPMSolverSDESampler(pipeline.sampler), pair, flow, noise, generator)
                return to_frames(vae.decode((latents / scale).permute(0, 2, 1, 3, 4)).sample[0])

            clips = {
                "phase (a) decoder, the true clip's representation": decoded(decoder, true),
                "the VAE's reconstruction": to_frames(
                    vae.decode(vae.encode(x.permute(0, 2, 1, 3, 4)).latent_dist.mean).sample[0]
                ),
                "rendered truth": frames,
            }
            if game is not None:  # what the game's first turn of this instruction decodes from
                result = game(TurnRequest(job_id=f"decoder-{index}", instruction=clip.instruction, seed=index))
                predicted = load_safetensors(result.representation)[REPRESENTATION_KEY].float()[None]
                clips |= {
                    "phase (c) decoder, the true clip's representation": decoded(game.decoder, true),
                    "phase (a) decoder, the MLLM's prediction": decoded(decoder, predicted),
                    "phase (c) decoder, the MLLM's prediction (the game)": decoded(game.decoder, predicted),
                }
            body = episode.world.character.body
            for name, made in clips.items():
                seen = metrics.decode_mp4(encode_mp4(made, CLIP.fps))  # as the game's clips come
                row = rows.setdefault(name, Row())
                row.found.append(metrics.is_figure(metrics.figure_track(seen, body)))
                row.errors.append(metrics.pixel_error(seen, frames))
                row.moved.append(metrics.moves_right_way(clip.action, seen, body))
                row.flows.append(metrics.flow_magnitude(seen))

    levels = [clip.motion for _, clip, _ in unseen]
    judged = sum(clip.action in metrics.MOTION_CHECKS for _, clip, _ in unseen)
    print(f"{args.run}: {len(unseen)} unseen clips ({judged} with a direction), shift {args.shift}, ", end="")
    print(f"guidance {args.guidance}\n")
    print("| clips from | figure found | pixel MAE | moves right way | quick/gentle flow |\n|---|---|---|---|---|")
    for name, row in rows.items():
        ratio = metrics.quick_over_gentle(row.flows, levels)
        print(
            f"| {name} | {sum(row.found)} of {len(row.found)} | {np.mean(row.errors):.1f} "
            f"| {sum(m is True for m in row.moved)} of {judged} | {'n/a' if ratio is None else f'{ratio:.2f}'} |"
        )
    print(f"\n{time.perf_counter() - started:.0f} s")


@dataclass
class Row:
    found: list[bool] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    moved: list[bool | None] = field(default_factory=list)
    flows: list[float] = field(default_factory=list)


if __name__ == "__main__":
    main()
