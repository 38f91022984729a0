"""Why the toy model plays without history: its second turn, given three kinds of past turn.

    python benchmarks/toyworld_history.py --run RUN [--checkpoint PATH] [--episodes 20] [--threads N]

Phase (b) trains the MLLM mostly with past turns carrying the phase-(a) encoder's representation of the *true*
past clip, then (its ``own_history`` share) with its own predictions; in the game a past turn carries the MLLM's
own prediction. On unseen two-turn episodes this prints the second clip's per-pixel error against the rendered
truth when the prompt holds no past turn, the true past clip's encoder representation (needs the run's
``phase_a/encoder.pt``), or the model's own first-turn prediction (what the game feeds back), and how far those two
representations are apart.
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
from training.phase_a import frames_to_tensor  # noqa: E402
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

    errors: dict[str, list[float]] = {"no past turn": [], "true past clip": [], "own prediction": []}
    cosines, norm_ratio = [], []
    for index, (episode, clips) in enumerate(zip(episodes, frames, strict=True)):
        first, second = episode.clips[0], episode.clips[1]
        with torch.no_grad():
            true_rep = encoder(
                frames_to_tensor(clips[:1]), instruction_bytes([first.instruction], model_config.max_instruction_bytes)
            )[0]
        own = pipeline(TurnRequest(job_id=f"h{index}a", instruction=first.instruction, seed=index))
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
            errors[name].append(metrics.pixel_error(metrics.decode_mp4(result.mp4), clips[1]))

    print(f"second turns of {len(episodes)} unseen episodes ({FRESH_CLIPS} clips, seed {FRESH_SEED}):\n")
    print("| past turn in the prompt | pixel MAE of turn 2 (0-255) |\n|---|---|")
    for name, values in errors.items():
        print(f"| {name} | {np.mean(values):.1f} |")
    print(
        f"\nown prediction vs the encoder's representation of the true clip: mean cosine {np.mean(cosines):.2f}, "
        f"norm ratio {np.mean(norm_ratio):.2f}"
    )


if __name__ == "__main__":
    main()
