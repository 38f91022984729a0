"""Loading pipelines by model name: what a worker, the demo and the benchmarks call.

Apart from ``pipeline.py`` so that the model code never imports its loaders: the toy model's and the
published checkpoints' loaders build an ``AnimeGamerPipeline``, and this module imports all three.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from worker.pipeline.config import RELEASE, TOY, get_config
from worker.pipeline.pipeline import ANY_CHARACTER, AnimeGamerPipeline, PipelineLoadError, resolve_device

log = logging.getLogger(__name__)


def load_pipeline(
    name: str,
    device: str = "auto",
    num_steps: int | None = None,
    *,
    character: str = "Qiqi",
    checkpoints: Path | str = "checkpoints",
) -> AnimeGamerPipeline:
    """One pipeline by model name (for the published model, ``character``'s alone, its LoRA merged)."""
    pipelines = load_pipelines(name, (character,), device, num_steps, checkpoints=checkpoints)
    return next(iter(pipelines.values()))


def load_pipelines(
    name: str,
    characters: Sequence[str],
    device: str = "auto",
    num_steps: int | None = None,
    *,
    checkpoints: Path | str = "checkpoints",
    offload_mllm: str = "auto",
    offload_decoder: str = "auto",
) -> dict[str, AnimeGamerPipeline]:
    """The pipelines a worker serves, by model name; built once per worker process.

    ``toy`` is the trained toy-world model shipped with the project; ``tiny`` and ``full`` are random
    weights; these serve any character, so the one pipeline is returned under ``ANY_CHARACTER``.
    ``animegamer`` loads each character's published MLLM parts and decoder beside one shared Mistral base.
    """
    resolved = resolve_device(device)
    started = time.perf_counter()
    if name == RELEASE:
        if resolved == "cpu" and device == "auto":  # an explicit cpu is the user's choice (tiny trees, tests)
            raise PipelineLoadError(
                "The published AnimeGamer model needs a CUDA GPU (about 24 GB) and none is visible; "
                "use ANIMEGAMER_MODEL=tiny on this machine."
            )
        from worker.pipeline.checkpoints.errors import CheckpointError  # transformers and peft: the published
        from worker.pipeline.checkpoints.load import load_release_pipelines  # model's alone

        try:
            pipelines = load_release_pipelines(
                checkpoints,
                tuple(characters),
                device=resolved,
                num_steps=num_steps,
                offload_mllm=offload_mllm,
                offload_decoder=offload_decoder,
            )
        except (CheckpointError, FileNotFoundError, ValueError) as exc:
            raise PipelineLoadError(str(exc)) from exc
    elif name == TOY:
        from worker.pipeline.toy import ToyCheckpointError, load_toy_pipeline

        try:
            pipelines = {ANY_CHARACTER: load_toy_pipeline(None, resolved, num_steps)}
        except ToyCheckpointError as exc:
            raise PipelineLoadError(str(exc)) from exc
    else:
        try:
            config = get_config(name)
        except ValueError as exc:
            raise PipelineLoadError(str(exc)) from exc
        if num_steps:
            config = replace(config, sampler=replace(config.sampler, num_steps=num_steps))
        if config.name == "full" and resolved == "cpu":
            raise PipelineLoadError(
                "The full-size model needs a CUDA GPU and none is visible; use ANIMEGAMER_MODEL=tiny on this machine."
            )
        offload = {"offload_mllm": offload_mllm == "on", "offload_decoder": offload_decoder == "on"}
        pipelines = {ANY_CHARACTER: AnimeGamerPipeline.random_weights(config, resolved, **offload)}
    log.info("loaded %s pipeline(s) on %s in %.1fs", name, resolved, time.perf_counter() - started)
    return pipelines


def tune_sampler(pipelines: dict[str, AnimeGamerPipeline], **changes: object) -> None:
    """Sampler choices a worker's settings make at run time (``skip_unconditional_below``, ``step_cache_below``), on
    loaded pipelines."""
    for pipeline in pipelines.values():
        pipeline.config = replace(pipeline.config, sampler=replace(pipeline.config.sampler, **changes))
