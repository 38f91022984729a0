"""Phase (b) at the tiny sizes for a few steps, in as many processes as it is launched with; the trained weights are
saved by the main process. Run alone (one process) or under ``python -m torch.distributed.run --nproc_per_node N``:
tests/training/test_character_phase_b.py compares the two at the same global batch.

    python tests/training/phase_b_processes.py OUT --batch 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.training.character_windows import windows  # noqa: E402
from training.character_phase_b import RepresentationAndStates, trainable  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.loop import train  # noqa: E402
from worker.pipeline.config import get_config  # noqa: E402
from worker.pipeline.pipeline import AnimeGamerPipeline  # noqa: E402

STEPS = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch", type=int, required=True, help="windows per step and process")
    args = parser.parse_args()
    torch.manual_seed(0)  # the same base and LoRA draw in every process and run
    pipe = AnimeGamerPipeline.random_weights(get_config("tiny"))
    trainable(pipe.mllm)
    for module in pipe.mllm.modules():  # LoRA dropout draws differ between processes: off, so the runs compare
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    data = windows(pipe.config.num_query_tokens, pipe.config.decoder.hidden_size)
    model = RepresentationAndStates(pipe.mllm, pipe.tokenizer)
    config = TrainConfig(steps=STEPS, batch_size=args.batch, learning_rate=3e-3, eval_every=0, checkpoint_every=0)
    result, trained, accelerator = train(model, data, None, list, config, args.out / "run", {"sizes": "tiny"})
    if accelerator.is_main_process:
        weights = {name: p.detach().clone() for name, p in trained.named_parameters() if p.requires_grad}
        torch.save(
            {"weights": weights, "losses": result.losses, "processes": accelerator.num_processes},
            args.out / "trained.pt",
        )


if __name__ == "__main__":
    main()
