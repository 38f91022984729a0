"""From a checkpoint directory in the release's layout to a ready pipeline, or a report of what is wrong.

The same code loads the published files and the tiny ones the tests write: every size comes from
the files (the Mistral directory's config.json, the decoder's and the VAE's tensor shapes), and
everything is checked before any weight reaches a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from worker.pipeline.characters import SharedMLLM
from worker.pipeline.checkpoints.decoder import load_decoder
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.layout import CHARACTERS, CheckpointLayout
from worker.pipeline.checkpoints.mllm import LORA_RANK, load_mllm, load_shared_mllm, mllm_config_from_dir
from worker.pipeline.checkpoints.vae import load_vae
from worker.pipeline.config import PipelineConfig, full
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.memory import MemoryPlan, Placement, allowed_placements, plan
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.tokenizer import AnimeGamerTokenizer

log = logging.getLogger(__name__)

PUBLISHED = full()


@dataclass(frozen=True)
class Clip:
    """What to render: not stored in any weight file. The release renders 17 frames at 480x720."""

    num_frames: int = PUBLISHED.num_frames
    height: int = PUBLISHED.height
    width: int = PUBLISHED.width


@dataclass
class Report:
    """What ``animegamer checkpoints check`` prints for one character."""

    character: str
    lines: list[str] = field(default_factory=list)
    ok: bool = True

    def good(self, text: str) -> None:
        self.lines.append(f"  ok   {text}")

    def bad(self, text: str) -> None:
        self.lines.append(f"  FAIL {text}")
        self.ok = False


def require_pair(layout: CheckpointLayout) -> None:
    """Each published MLLM was adapted together with its own decoder: never mix characters."""
    for folder, kind in ((layout.mllm_file.parent, "MLLM"), (layout.decoder_dir, "VDM_Decoder")):
        if folder.is_dir():
            continue
        others = sorted(p.name.split("-", 1)[1] for p in (layout.root / "AnimeGamer").glob(f"{kind}-*"))
        hint = (
            f"; there is {kind} for {', '.join(others)}, but each MLLM was adapted with its own decoder and they do "
            "not mix"
            if others
            else ""
        )
        raise CheckpointError(folder, "missing" + hint, f"the {kind} of {layout.character}")


def load_release_pipeline(root: Path | str, character: str, **options: Any):  # -> AnimeGamerPipeline
    """One character's pipeline, its LoRA merged: what a worker serving only that character runs."""
    return load_release_pipelines(root, (character,), **options)[character]


def load_release_pipelines(
    root: Path | str,
    characters: Sequence[str],
    *,
    device: str,
    clip: Clip = Clip(),
    num_steps: int | None = None,
    dtype: torch.dtype | None = None,
    offload_mllm: str = "auto",
    offload_decoder: str = "auto",
) -> dict[str, Any]:  # -> {character: AnimeGamerPipeline} (imported lazily: pipeline.py imports this module's callers)
    """Every character's pipeline from the published files (or tiny ones in the same layout), in one worker.

    The Mistral base is loaded once: with one character its LoRA is merged, with several each
    character's trained parts sit beside the shared base (worker/pipeline/characters.py). Each
    character has its own decoder; the tokenizer and the VAE are shared. Where each part lives
    is chosen by the memory plan from the GPU's free memory (``auto``) or pinned (``on``/``off``).

    Args:
        dtype: the weights' dtype; default bf16 on a GPU (as the release runs), float32 on the CPU.
    """
    from worker.pipeline.pipeline import PipelineLoadError

    if not characters:
        raise ValueError("no character to load")
    layouts = {character: CheckpointLayout(Path(root), character) for character in characters}
    for layout in layouts.values():
        require_pair(layout)
    try:
        torch_device = torch.device(device)
    except RuntimeError as exc:
        raise PipelineLoadError(f"ANIMEGAMER_DEVICE={device} is not a torch device") from exc
    on_gpu = torch_device.type != "cpu"
    # Half-precision matmuls and convolutions are slow or missing on CPUs; bf16 there only when asked.
    dtype = dtype or (torch.bfloat16 if on_gpu else torch.float32)

    # 1. Cheap checks and sizes first: shapes only, nothing large is read yet.
    first = layouts[characters[0]]
    tokenizer = AnimeGamerTokenizer.from_checkpoint_dir(first.mistral_dir)
    decoder_files = {character: layout.decoder_file() for character, layout in layouts.items()}
    if not first.vae_file.is_file():
        raise CheckpointError(first.vae_file, "missing", "the CogVideoX 3D VAE ({'state_dict': ...})")
    config = found_config(first, clip, num_steps)

    # 2. Where each part lives, from the plan of exactly this placement (memory.py)
    several = len(characters) > 1
    needs = memory_plan(config, len(characters), dtype)
    allowed = allowed_placements(offload_mllm, offload_decoder)
    placement = Placement()
    if on_gpu:
        free, _ = torch.cuda.mem_get_info(torch_device)
        placement = needs.choose(free, allowed, "animegamer model")
    mllm_home = "cpu" if placement.offload_mllm else device
    decoder_home = "cpu" if placement.offload_decoder else device

    # 3. The parts (each loader checks every key and shape before it reads a weight)
    vae = load_vae(first.vae_file, dtype=dtype, device=device).eval()
    decoders = {c: load_decoder(f, dtype=dtype, device=decoder_home).eval() for c, f in decoder_files.items()}
    width = config.decoder.hidden_size
    mllm_options = {"vocab_size": tokenizer.vocab_size, "representation_dim": width, "dtype": dtype}
    shared = None
    if several:
        mllm_files = {character: layout.mllm_file for character, layout in layouts.items()}
        shared = load_shared_mllm(first.mistral_dir, mllm_files, device=mllm_home, **mllm_options)
        mllm = shared.mllm
    else:
        mllm = load_mllm(first.mistral_dir, first.mllm_file, device=mllm_home, **mllm_options)
        assert mllm is not None
    log.info("loaded %s from %s on %s (%s)", ", ".join(characters), root, device, placement.describe())
    return assemble(config, tokenizer, mllm, shared, decoders, vae, torch_device, dtype, placement)


def assemble(
    config: PipelineConfig,
    tokenizer: AnimeGamerTokenizer,
    mllm: AnimeGamerMLLM,
    shared: SharedMLLM | None,
    decoders: dict[str, AnimeGamerDecoder],
    vae: torch.nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    placement: Placement,
) -> dict[str, Any]:
    """One pipeline per character over the shared parts, each moving its parts by ``placement``."""
    from worker.pipeline.pipeline import AnimeGamerPipeline

    return {
        character: AnimeGamerPipeline(
            config,
            tokenizer,
            mllm.eval(),
            decoder,
            vae,
            device,
            dtype,
            dtype,
            offload_mllm=placement.offload_mllm,
            offload_decoder=placement.offload_decoder,
            shared=shared,
            character=character,
        )
        for character, decoder in decoders.items()
    }


def found_config(layout: CheckpointLayout, clip: Clip = Clip(), num_steps: int | None = None) -> PipelineConfig:
    """The pipeline's sizes as the files give them (shapes and config.json only; no weight is read)."""
    decoder = load_decoder(layout.decoder_file(), dtype=torch.bfloat16, device="meta")
    vae = load_vae(layout.vae_file, dtype=torch.bfloat16, device="meta")
    return PipelineConfig(
        name="animegamer",
        decoder=_decoder_config(decoder),
        vae=_vae_config(vae),
        mllm=mllm_config_from_dir(layout.mistral_dir),
        num_frames=clip.num_frames,
        height=clip.height,
        width=clip.width,
        sampler=replace(PUBLISHED.sampler, num_steps=num_steps or PUBLISHED.sampler.num_steps),
        label="",
    )


def memory_plan(config: PipelineConfig, characters: int, dtype: torch.dtype = torch.bfloat16) -> MemoryPlan:
    """The GPU plan of a worker serving ``characters`` of these sizes: one merged MLLM, or a shared base + LoRA."""
    return plan(config, dtype, dtype, characters=characters, lora_rank=LORA_RANK if characters > 1 else 0)


def _decoder_config(decoder):
    from worker.pipeline.config import DecoderConfig

    fields = DecoderConfig.__dataclass_fields__
    return DecoderConfig(**{name: decoder.config[name] for name in fields})


def _vae_config(vae):
    from worker.pipeline.config import VAEConfig

    cfg = vae.config
    return VAEConfig(
        block_out_channels=tuple(cfg.block_out_channels),
        latent_channels=cfg.latent_channels,
        layers_per_block=cfg.layers_per_block,
        norm_num_groups=cfg.norm_num_groups,
        scaling_factor=cfg.scaling_factor,
        temporal_compression=cfg.temporal_compression_ratio,
    )


def check(root: Path | str, characters: tuple[str, ...] = CHARACTERS) -> list[Report]:
    """Every expected file, whether it is there and complete, and the sizes found, per character.

    Weights are checked on the ``meta`` device or by shape alone, so this reads the files' indexes
    and shapes, not their 25 GB of values, and needs no GPU.
    """
    reports = []
    for character in characters:
        layout = CheckpointLayout(Path(root), character)
        report = Report(character)
        try:
            tokenizer = AnimeGamerTokenizer.from_checkpoint_dir(layout.mistral_dir)
            report.good(f"{layout.mistral_dir / 'tokenizer.model'}: {tokenizer.vocab_size} ids with the added tokens")
        except (FileNotFoundError, ValueError) as exc:
            report.bad(str(exc))
            tokenizer = None
        decoder_width = PUBLISHED.decoder.hidden_size
        try:
            decoder_file = layout.decoder_file()
            decoder = load_decoder(decoder_file, dtype=torch.bfloat16, device="meta")
            decoder_width = decoder.hidden_size
            report.good(f"{decoder_file}: every tensor found; {_differences(_decoder_config(decoder), 'decoder')}")
        except CheckpointError as exc:
            report.bad(str(exc))
        try:
            vae = load_vae(layout.vae_file, dtype=torch.bfloat16, device="meta")
            report.good(f"{layout.vae_file}: every tensor found; {_differences(_vae_config(vae), 'vae')}")
        except CheckpointError as exc:
            report.bad(str(exc))
        try:
            require_pair(layout)
            load_mllm(
                layout.mistral_dir,
                layout.mllm_file,
                vocab_size=tokenizer.vocab_size if tokenizer else PUBLISHED.mllm.base_vocab_size + 284,
                representation_dim=decoder_width,
                validate_only=True,
            )
            from worker.pipeline.checkpoints.mllm import mllm_config_from_dir

            sizes = _differences(mllm_config_from_dir(layout.mistral_dir), "mllm")
            report.good(f"{layout.mllm_file} with {layout.mistral_dir}: every tensor found; {sizes}")
        except CheckpointError as exc:
            report.bad(str(exc))
        reports.append(report)
    return reports


def _differences(found: object, part: str) -> str:
    published = {"decoder": PUBLISHED.decoder, "vae": PUBLISHED.vae, "mllm": PUBLISHED.mllm}[part]
    diffs = [
        f"{name} {getattr(found, name)} (published {getattr(published, name)})"
        for name in published.__dataclass_fields__
        if getattr(found, name) != getattr(published, name)
    ]
    return "sizes as published" if not diffs else "sizes differ from the published: " + ", ".join(diffs)
