"""From a checkpoint directory in the release's layout to a ready pipeline, or a report of what is wrong.

The same code loads the published files and the tiny ones the tests write: every size comes from
the files (the Mistral directory's config.json, the decoder's and the VAE's tensor shapes), and
everything is checked before any weight reaches a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from worker.pipeline.checkpoints.decoder import load_decoder
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.layout import CHARACTERS, CheckpointLayout
from worker.pipeline.checkpoints.mllm import load_mllm
from worker.pipeline.checkpoints.vae import load_vae
from worker.pipeline.config import PipelineConfig, full
from worker.pipeline.memory import GIB, MemoryPlan, plan
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


def load_release_pipeline(
    root: Path | str,
    character: str,
    *,
    device: str,
    clip: Clip = Clip(),
    num_steps: int | None = None,
    decoder_dtype: torch.dtype = torch.bfloat16,
    offload_mllm: bool | None = None,
):  # -> AnimeGamerPipeline (imported lazily: the pipeline module imports this one's callers)
    """The character's pipeline from the published files (or tiny ones in the same layout).

    ``offload_mllm=None`` decides from the GPU's free memory: the MLLM stays resident when
    everything fits, and visits the GPU only for its passes when it does not.
    """
    from worker.pipeline.pipeline import AnimeGamerPipeline, PipelineLoadError

    layout = CheckpointLayout(Path(root), character)
    require_pair(layout)
    mllm_dtype = torch.bfloat16 if device != "cpu" else torch.float32
    if device == "cpu":
        decoder_dtype = torch.float32  # half-precision convolutions are slow or missing on CPUs

    # 1. Cheap checks and sizes first: nothing large is read yet.
    tokenizer = AnimeGamerTokenizer.from_checkpoint_dir(layout.mistral_dir)
    decoder_file = layout.decoder_file()
    if not layout.vae_file.is_file():
        raise CheckpointError(layout.vae_file, "missing", "the CogVideoX 3D VAE ({'state_dict': ...})")

    # 2. Build the parts (each loader checks every key and shape before it reads a weight).
    decoder = load_decoder(decoder_file, dtype=decoder_dtype, device=device).eval()
    vae = load_vae(layout.vae_file, dtype=decoder_dtype, device=device).eval()
    config = PipelineConfig(
        name="animegamer",
        decoder=_decoder_config(decoder),
        vae=_vae_config(vae),
        mllm=replace(PUBLISHED.mllm),  # replaced below by the sizes of config.json
        num_frames=clip.num_frames,
        height=clip.height,
        width=clip.width,
        sampler=replace(PUBLISHED.sampler, num_steps=num_steps or PUBLISHED.sampler.num_steps),
        label="",
    )
    if offload_mllm is None:
        offload_mllm = _should_offload(config, mllm_dtype, decoder_dtype, device)
    mllm = load_mllm(
        layout.mistral_dir,
        layout.mllm_file,
        vocab_size=tokenizer.vocab_size,
        representation_dim=decoder.hidden_size,
        dtype=mllm_dtype,
        device="cpu" if offload_mllm else device,
    )
    assert mllm is not None
    config = replace(config, mllm=mllm.config)
    try:
        torch_device = torch.device(device)
    except RuntimeError as exc:
        raise PipelineLoadError(f"ANIMEGAMER_DEVICE={device} is not a torch device") from exc
    log.info("loaded %s from %s on %s (offload MLLM: %s)", character, root, device, offload_mllm)
    return AnimeGamerPipeline(
        config, tokenizer, mllm.eval(), decoder, vae, torch_device, mllm_dtype, decoder_dtype, offload_mllm
    )


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


def _should_offload(config: PipelineConfig, mllm_dtype: torch.dtype, decoder_dtype: torch.dtype, device: str) -> bool:
    if not device.startswith("cuda"):
        return False
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return offload_decision(plan(config, mllm_dtype, decoder_dtype), free, config.name)


def offload_decision(needs: MemoryPlan, free_bytes: int, model: str) -> bool:
    """Resident when everything fits, offloaded when only that fits; else say what is needed."""
    from worker.pipeline.pipeline import PipelineLoadError

    if needs.gpu_bytes(offload_mllm=False) <= free_bytes:
        return False
    if needs.gpu_bytes(offload_mllm=True) <= free_bytes:
        log.info("not everything fits in %.1f GiB free: the MLLM is offloaded between its passes", free_bytes / GIB)
        return True
    raise PipelineLoadError(
        f"This GPU has {free_bytes / GIB:.1f} GiB free; the {model} model needs about "
        f"{needs.gpu_bytes(offload_mllm=False) / GIB:.1f} GiB, or {needs.gpu_bytes(offload_mllm=True) / GIB:.1f} GiB "
        "with the MLLM offloaded (ANIMEGAMER_OFFLOAD_MLLM=on). Free the GPU or use a larger one."
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
