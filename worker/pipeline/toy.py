"""The toy-world model: our own checkpoint format, and the pipeline that loads it.

``animegamer train all`` (training/) trains the three phases on the procedurally drawn toy world and writes one
safetensors file: the MLLM under ``mllm.``, the decoder under ``decoder.``, the VAE under ``vae.``, and metadata
saying the format, the sizes' preset and the latents' scale. The file ships with the project
(``worker/pipeline/toy_weights/toyworld.safetensors``, about 11 MB) and is the embedded default model; reading it
needs nothing from training/.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from game.contract import TOY_LABEL
from worker.pipeline.config import PipelineConfig, get_config, toy
from worker.pipeline.tokenizer import AnimeGamerTokenizer, WordBase

if TYPE_CHECKING:
    from worker.pipeline.pipeline import AnimeGamerPipeline

TOY = "toy"  # the model name settings and workers use
FORMAT = "animegamer-toy"
VERSION = "1"
SHIPPED = Path(__file__).parent / "toy_weights" / "toyworld.safetensors"
TOY_HISTORY_WINDOW = 3  # phase (b)'s prompts: the current turn and up to 2 past ones (the game's default is 1)
LABEL = TOY_LABEL
PARTS = ("mllm", "decoder", "vae")


class ToyCheckpointError(ValueError):
    """The toy model's file is missing or is not what ``animegamer train all`` writes; the message names it."""


def toy_config(preset: str, scaling_factor: float, words: tuple[str, ...] = ()) -> PipelineConfig:
    """The sizes a file was trained at (``toy``, or ``tiny`` in tests) with its measured latent scale, the MLLM's
    base vocabulary grown by the file's word list."""
    base = toy() if preset == TOY else get_config(preset)
    mllm = replace(base.mllm, base_vocab_size=WordBase(words).vocab_size)
    return replace(base, name=TOY, label=LABEL, mllm=mllm, vae=replace(base.vae, scaling_factor=scaling_factor))


def toy_tokenizer(words: tuple[str, ...]) -> AnimeGamerTokenizer:
    """The tokenizer a toy file's MLLM was trained with: bytes, and one id per word of its list."""
    return AnimeGamerTokenizer(WordBase(words))


def save_toy_checkpoint(
    path: Path,
    parts: dict[str, dict[str, torch.Tensor]],
    preset: str,
    scaling_factor: float,
    trained: dict[str, object],
    words: tuple[str, ...] = (),
) -> None:
    """Write the three state dicts and the metadata into one file (``trained`` records steps and data, ``words``
    the MLLM's word list)."""
    tensors = {
        f"{part}.{key}": value.detach().float().cpu().contiguous()
        for part in PARTS
        for key, value in parts[part].items()
    }
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "preset": preset,
        "scaling_factor": repr(scaling_factor),
        "history_window": str(TOY_HISTORY_WINDOW),
        "trained": json.dumps(trained, sort_keys=True),
        "vocabulary": json.dumps(list(words)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)


def read_toy_checkpoint(
    path: Path, *, header_only: bool = False
) -> tuple[PipelineConfig, dict[str, dict[str, torch.Tensor]], dict[str, str]]:
    """The config, each part's state dict and the metadata; every way the file can be wrong is named.

    ``header_only`` checks the file and its metadata without reading a tensor (the parts come back
    empty): what a worker's parent process checks before its pool's child loads the weights.
    """
    if not path.is_file():
        raise ToyCheckpointError(
            f"{path} is missing: expected the toy model `animegamer train all` writes (model.safetensors in its "
            "--out folder). Copy it there, or set ANIMEGAMER_MODEL=tiny for random weights."
        )
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            keys = list(handle.keys())
            tensors = {} if header_only else {key: handle.get_tensor(key) for key in keys}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ToyCheckpointError(f"{path} is not a readable safetensors file ({exc}); expected the toy model.") from exc
    if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
        raise ToyCheckpointError(
            f"{path} says format {metadata.get('format')!r} version {metadata.get('version')!r}; "
            f"expected {FORMAT!r} version {VERSION!r}."
        )
    try:
        config = toy_config(metadata["preset"], float(metadata["scaling_factor"]), checkpoint_words(metadata))
    except (KeyError, ValueError) as exc:
        raise ToyCheckpointError(
            f"{path} has no usable preset, scaling_factor or vocabulary in its metadata ({exc})."
        ) from exc
    parts: dict[str, dict[str, torch.Tensor]] = {part: {} for part in PARTS}
    for key in keys:
        part, _, name = key.partition(".")
        if part not in parts:
            raise ToyCheckpointError(f"{path} holds {key!r}; expected keys under {', '.join(PARTS)}.")
        if not header_only:
            parts[part][name] = tensors[key]
    return config, parts, metadata


def checkpoint_words(metadata: dict[str, str]) -> tuple[str, ...]:
    """The word list in a toy file's metadata: a JSON list of distinct strings; none in files written before."""
    words = json.loads(metadata.get("vocabulary", "[]"))
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        raise ValueError("vocabulary is not a JSON list of words")
    WordBase(words)  # distinct and non-empty, or ValueError
    return tuple(words)


def load_toy_pipeline(
    path: Path | None = None, device: str = "cpu", num_steps: int | None = None
) -> AnimeGamerPipeline:
    """The trained toy model as a pipeline, from ``path`` or the shipped file."""
    from worker.pipeline.pipeline import AnimeGamerPipeline  # the worker's parent reads toy headers without it

    path = Path(path) if path is not None else SHIPPED
    config, parts, metadata = read_toy_checkpoint(path)
    if num_steps:
        config = replace(config, sampler=replace(config.sampler, num_steps=num_steps))
    tokenizer = toy_tokenizer(checkpoint_words(metadata))
    # the modules, then every weight from the file
    pipeline = AnimeGamerPipeline.random_weights(config, device, tokenizer=tokenizer)
    for part, module in (("mllm", pipeline.mllm), ("decoder", pipeline.decoder), ("vae", pipeline.vae)):
        expected = module.state_dict()
        missing = sorted(set(expected) - set(parts[part]))
        unexpected = sorted(set(parts[part]) - set(expected))
        wrong = sorted(k for k in set(expected) & set(parts[part]) if expected[k].shape != parts[part][k].shape)
        if missing or unexpected or wrong:
            detail = "; ".join(
                f"{what} {names[:3]}"
                for what, names in (("missing", missing), ("unexpected", unexpected), ("other shape", wrong))
                if names
            )
            raise ToyCheckpointError(f"{path}: the {part} does not fit the {config.name} sizes ({detail}).")
        module.load_state_dict(parts[part])
    return pipeline
