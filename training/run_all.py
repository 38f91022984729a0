"""`animegamer train all`: the recipe's phases in order, then the model file inference loads.

Each phase resumes on its own (``training.loop``), so rerunning the same command after a stop continues the phase
that was running and skips the finished ones. The folder ``out`` holds ``phase_a/``, ``phase_b/``, ``phase_c/`` when the
recipe has a phase (c) (the shipped one has none: ``training.config.PHASE_C`` says why) and, at the end,
``model.safetensors`` in the toy model's format (``worker.pipeline.toy``), with phase (c)'s decoder when it ran and
phase (a)'s otherwise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from training.config import RECIPE, ToyModelConfig, TrainConfig
from training.loop import TrainResult
from training.phase_a import train_phase_a
from training.phase_b import train_phase_b
from training.phase_c import train_phase_c
from worker.pipeline.toy import save_toy_checkpoint

logger = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
T = TypeVar("T", bound=TrainResult)


@dataclass
class AllResult:
    model: Path
    steps: dict[str, int] = field(default_factory=dict)  # phase -> last finished step
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall time of this run
    held_out: dict[str, float] = field(default_factory=dict)  # phase -> last held-out loss of this run


def train_all(
    data: Path,
    out: Path,
    recipe: dict[str, TrainConfig] | None = None,
    model_config: ToyModelConfig | None = None,
) -> AllResult:
    recipe = recipe or RECIPE
    model_config = model_config or ToyModelConfig()
    out = Path(out)
    a, b, c = out / "phase_a", out / "phase_b", out / "phase_c"
    result = AllResult(model=out / MODEL_FILE)

    def timed(name: str, run: Callable[[], T]) -> T:
        started = time.perf_counter()
        phase = run()
        result.seconds[name] = time.perf_counter() - started
        result.steps[name] = phase.step
        if phase.eval_losses:
            result.held_out[name] = phase.eval_losses[max(phase.eval_losses)]
        return phase

    phase_a = timed("phase-a", lambda: train_phase_a(data, a, recipe["phase-a"], model_config))
    timed("phase-b", lambda: train_phase_b(data, b, a, recipe["phase-b"], model_config))
    decoder = a / "decoder.pt"
    if "phase-c" in recipe:
        timed("phase-c", lambda: train_phase_c(data, c, a, b, recipe["phase-c"], model_config))
        decoder = c / "decoder.pt"

    parts = {
        "mllm": torch.load(b / "mllm.pt", weights_only=True),
        "decoder": torch.load(decoder, weights_only=True),
        "vae": torch.load(a / "vae.pt", weights_only=True),
    }
    trained = {
        "data": str(data),
        "steps": result.steps,
        "vae_steps": phase_a.vae_step,
        "recipe": {name: config.steps for name, config in recipe.items()},
    }
    preset, scale = model_config.pipeline.name, phase_a.scaling_factor
    save_toy_checkpoint(result.model, parts, preset, scale, trained, words=model_config.words)
    logger.info("wrote %s", result.model)
    return result
