"""Does history help the toy model? Its second turn, given three kinds of past turn.

    python benchmarks/toyworld_history.py --run RUN [--checkpoint PATH] [--episodes 20] [--threads N]

Phase (b) trains the MLLM mostly with past turns carrying the phase-(a) encoder's representation of the *true*
past clip, then (its ``own_history`` share) with its own predictions; in the game a past turn carries the MLLM's
own prediction. On unseen two-turn episodes this prints the second clip's per-pixel error against the rendered
truth when the prompt holds no past turn, the true past clip's encoder representation (needs the run's
``phase_a/encoder.pt``), or the model's own first-turn prediction (what the game feeds back), and how far those two
representations are apart. Beside the error: whether turn 2 shows the character, how far its colours drift from
turn 1's, and, where both turns are in the same place (the figure goes on from where it stopped), how far it jumps
between turn 1's last frame and turn 2's first. Turn 1 is the true clip when that is the past turn given, else the
clip the player saw.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from game.contract import HistoryTurn, TurnRequest  # noqa: E402
from training import metrics  # noqa: E402
from training.config import ToyModelConfig  # noqa: E402
from training.dataset import load_toyworld, write_toyworld  # noqa: E402
from training.encoder import ClipEncoder, instruction_bytes  # noqa: E402
from training.phase_a import encode_latents, frames_to_tensor  # noqa: E402
from worker.pipeline.config import toy  # noqa: E402
from worker.pipeline.pipeline import REPRESENTATION_KEY  # noqa: E402
from worker.pipeline.toy import load_toy_pipeline  # noqa: E402

FRESH_CLIPS, FRESH_SEED = 300, 12345  # the same unseen set as toyworld_eval.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the `train all` folder (for phase_a/encoder.pt)")
    parser.add_argument("--checkpoint", type=Path, help="the toy model file (default: the shipped one)")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    pipeline = load_toy_pipeline(args.checkpoint)
    model_config = ToyModelConfig(pipeline=toy())
    encoder = ClipEncoder(model_config).eval()
    encoder.load_state_dict(torch.load(args.run / "phase_a" / "encoder.pt", weights_only=True))
    with tempfile.TemporaryDirectory() as tmp:
        write_toyworld(Path(tmp) / "eval", clips=FRESH_CLIPS, seed=FRESH_SEED)
        world = load_toyworld(Path(tmp) / "eval")
        episodes = [e for e in world.episodes if len(e.clips) >= 2][: args.episodes]
        frames = [e.frames()[:2] for e in episodes]  # (2, T, H, W, 3) each

    names = ("no past turn", "true past clip", "own prediction")
    errors: dict[str, list[float]] = {name: [] for name in names}
    found: dict[str, list[bool]] = {name: [] for name in names}
    drifts: dict[str, list[float]] = {name: [] for name in names}
    jumps: dict[str, list[float]] = {name: [] for name in names}
    cosines, norm_ratio = [], []
    for index, (episode, clips) in enumerate(zip(episodes, frames, strict=True)):
        first, second = episode.clips[0], episode.clips[1]
        with torch.no_grad():
            latents = encode_latents(pipeline.vae, frames_to_tensor(clips[:1]), pipeline.config.vae.scaling_factor)
            true_rep = encoder(latents, instruction_bytes([first.instruction], model_config.max_instruction_bytes))[0]
        own = pipeline(TurnRequest(job_id=f"h{index}a", instruction=first.instruction, seed=index))
        own_clip = metrics.decode_mp4(own.mp4)
        own_rep = load_safetensors(own.representation)[REPRESENTATION_KEY].float()
        cosines.append(float(torch.nn.functional.cosine_similarity(true_rep, own_rep, dim=-1).mean()))
        norm_ratio.append(float(own_rep.norm(dim=-1).mean() / true_rep.norm(dim=-1).mean()))
        past = {
            "no past turn": None,
            "true past clip": save_safetensors({REPRESENTATION_KEY: true_rep.half().contiguous()}),
            "own prediction": own.representation,
        }
        for name, representation in past.items():
            history = (
                []
                if representation is None
                else [HistoryTurn(instruction=first.instruction, representation=representation, deltas=first.deltas)]
            )
            result = pipeline(
                TurnRequest(job_id=f"h{index}b", instruction=second.instruction, seed=index, history=history)
            )
            clip = metrics.decode_mp4(result.mp4)
            errors[name].append(metrics.pixel_error(clip, clips[1]))
            # turn 1 as the prompt describes it: the true clip, else the clip the player saw
            before = clips[0] if name == "true past clip" else own_clip
            body = episode.world.character.body
            colours = [metrics.figure_colour(before, body), metrics.figure_colour(clip, body)]
            found[name].append(colours[1] is not None)
            drifts[name] += [drift for drift in metrics.colour_drift(colours) if drift is not None]
            if second.place == first.place:  # the figure goes on from where it stopped
                jump = metrics.position_jump(before, clip, body)
                jumps[name] += [] if jump is None else [jump]

    print(f"second turns of {len(episodes)} unseen episodes ({FRESH_CLIPS} clips, seed {FRESH_SEED}):\n")
    print(
        "| past turn in the prompt | pixel MAE of turn 2 (0-255) ↓ | figure found ↑ | colour drift from turn 1 ↓ "
        "| position jump, same place (px) ↓ |\n|---|---|---|---|---|"
    )
    for name in names:
        drift = f"{np.mean(drifts[name]):.1f}" if drifts[name] else "—"
        jump = f"{np.mean(jumps[name]):.1f} ({len(jumps[name])} pairs)" if jumps[name] else "—"
        print(f"| {name} | {np.mean(errors[name]):.1f} | {100 * np.mean(found[name]):.0f}% | {drift} | {jump} |")
    print(
        f"\nown prediction vs the encoder's representation of the true clip: mean cosine {np.mean(cosines):.2f}, "
        f"norm ratio {np.mean(norm_ratio):.2f}"
    )


if __name__ == "__main__":
    main()
