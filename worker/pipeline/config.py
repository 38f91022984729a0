"""Sizes of the AnimeGamer pipeline, as plain dataclasses.

``full`` is the published model (ANIMEGAMER.md); ``tiny`` is the same architecture small
enough to run a whole turn on a laptop CPU in about a second. Every module takes its part of
this config, so the code path is identical at both sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

# "intended": the project's choices where the release's sampler has a slip; "release": the release's own numerics,
# for parity runs (README, "Choices worth knowing"). One switch for all of them, see SamplerConfig.numerics.
Numerics = Literal["intended", "release"]

# The AnimeGamer added tokens, in id order after the base vocabulary (ANIMEGAMER.md).
NUM_FRAME_TOKENS = 256  # <frame_00000>..<frame_00255>; only the first 226 are used
NUM_QUERY_TOKENS = 226  # the representation's length: 30 text + 196 image condition slots


@dataclass(frozen=True)
class MLLMConfig:
    base_vocab_size: int = 32000  # Mistral's; the AnimeGamer tokens follow it (+284)
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 8
    intermediate_size: int = 14336
    max_position_embeddings: int = 32768
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5


@dataclass(frozen=True)
class DecoderConfig:
    num_layers: int = 30
    num_heads: int = 30
    head_dim: int = 64  # hidden = heads x head_dim = 1920, also the representation's width
    time_embed_dim: int = 512
    latent_channels: int = 16
    patch_size: int = 2
    text_embed_dim: int = 4096  # T5-XXL width; only the constant unconditional tokens use it
    ip_embed_dim: int = 768  # OpenCLIP width; likewise
    num_text_tokens: int = 30
    num_ip_tokens: int = 196
    spatial_interpolation_scale: float = 1.875
    temporal_interpolation_scale: float = 1.0

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim


@dataclass(frozen=True)
class VAEConfig:
    block_out_channels: tuple[int, ...] = (128, 256, 256, 512)
    latent_channels: int = 16
    layers_per_block: int = 3
    norm_num_groups: int = 32
    scaling_factor: float = 1.15258426
    temporal_compression: int = 4

    @property
    def spatial_compression(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)


@dataclass(frozen=True)
class SamplerConfig:
    num_steps: int = 50
    shift_scale: float = 3.0  # SNR shift of the release's discretisation
    guidance_scale: float = 6.0  # dynamic CFG peaks at 1 + this
    guidance_exponent: float = 5.0
    # "release": dynamic CFG fed the release's `50 - timestep`, x0's alpha rounded to the 1000-step table (sampler.py)
    numerics: Numerics = "intended"
    # Steps whose CFG weight w is within this of 1 run the conditional half alone: the pair's result is
    # v_cond + (w - 1)(v_cond - v_uncond), so the unconditional half would move it by less than that fraction of
    # the guidance term. 0 runs both halves at every step, as the release does.
    skip_unconditional_below: float = 0.0
    # A step whose first decoder block changed its residual by less than this fraction since the last step that ran
    # every block reuses the other blocks' residual from that step (step_cache.py). 0 runs every block at every
    # step, as the release does.
    step_cache_below: float = 0.0


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    mllm: MLLMConfig = field(default_factory=MLLMConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    num_frames: int = 17
    height: int = 480
    width: int = 720
    fps: int = 8
    num_query_tokens: int = NUM_QUERY_TOKENS
    weights_seed: int = 0  # random-weight models are built from this seed
    label: str = ""  # shown beside every clip; non-empty for random weights

    @property
    def latent_frames(self) -> int:
        return (self.num_frames - 1) // self.vae.temporal_compression + 1

    @property
    def latent_height(self) -> int:
        return self.height // self.vae.spatial_compression

    @property
    def latent_width(self) -> int:
        return self.width // self.vae.spatial_compression

    def __post_init__(self) -> None:
        step = self.vae.spatial_compression * self.decoder.patch_size
        if self.height % step or self.width % step:
            raise ValueError(f"height and width must be multiples of {step}, got {self.height}x{self.width}")
        if (self.num_frames - 1) % self.vae.temporal_compression:
            raise ValueError(f"num_frames must be 1 + a multiple of {self.vae.temporal_compression}")
        if self.vae.latent_channels != self.decoder.latent_channels:
            raise ValueError("the VAE and the decoder must agree on latent channels")
        if self.num_query_tokens != self.decoder.num_text_tokens + self.decoder.num_ip_tokens:
            raise ValueError("num_query_tokens must equal the decoder's text + image condition tokens")


def full() -> PipelineConfig:
    """The published sizes: Mistral-7B MLLM, CogVideoX-2B decoder, 17 frames at 480x720."""
    return PipelineConfig(name="full", label="full-size model, random weights")  # game.contract's label


def tiny() -> PipelineConfig:
    """Same architecture, CPU sizes: a 17-frame 64x96 clip (the 2:3 of 480x720)."""
    return PipelineConfig(
        name="tiny",
        mllm=MLLMConfig(
            base_vocab_size=259,  # byte-level base vocabulary, see tokenizer.py
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=128,
            max_position_embeddings=4096,
        ),
        decoder=DecoderConfig(
            num_layers=2,
            num_heads=2,
            head_dim=16,
            time_embed_dim=32,
            latent_channels=4,
            text_embed_dim=32,
            ip_embed_dim=16,
        ),
        vae=VAEConfig(block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=8),
        sampler=SamplerConfig(),
        height=64,
        width=96,
        label="tiny model, random weights",
    )


def toy() -> PipelineConfig:
    """The toy-world model's sizes (training/): the tiny clip with a wider MLLM, decoder and VAE, trained on the CPU.

    Its weights ship with the project (``worker/pipeline/toy_weights``); this preset is only the shapes they fill.
    """
    base = tiny()
    return replace(
        base,
        name="toy",
        mllm=replace(base.mllm, hidden_size=128, num_layers=4, intermediate_size=256),
        decoder=replace(base.decoder, num_layers=4, num_heads=4, head_dim=32, time_embed_dim=64, latent_channels=8),
        vae=replace(base.vae, block_out_channels=(16, 16, 32, 32), latent_channels=8),
        # no guidance: the figure is found in 5 of 6 unseen test turns without it, 6 with scale 2, 2 with the
        # release's 6; six turns do not pay for two decoder passes a step, and phase (a) never trains the
        # unconditional tokens (README, "Guidance")
        sampler=replace(base.sampler, guidance_scale=0.0),
        label="toy model, trained on the toy world",  # game.contract.TOY_LABEL (game/ may not be imported here)
    )


PRESETS = {"tiny": tiny, "full": full}
RELEASE = "animegamer"  # the published checkpoints; sizes come from the files, not from a preset
TOY = "toy"  # the trained toy-world model shipped with the project (worker.pipeline.toy)
MODEL_NAMES = (TOY, *sorted(PRESETS), RELEASE)


class UnknownModelError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"Unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)}.")


def check_model_name(name: str) -> None:
    if name not in MODEL_NAMES:
        raise UnknownModelError(name)


def get_config(name: str, **overrides: object) -> PipelineConfig:
    if name not in PRESETS:
        raise UnknownModelError(name)
    return replace(PRESETS[name](), **overrides)  # type: ignore[arg-type]
