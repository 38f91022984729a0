"""The AnimeGamer video decoder: a CogVideoX-2B diffusion transformer conditioned on the MLLM's representation.

It differs from diffusers' ``CogVideoXTransformer3DModel`` in three ways (ANIMEGAMER.md, "Decoder"):

- the 226 condition tokens come straight from the MLLM (already 1920 wide), so there is no text projection;
- a motion-scope ("flow") embedding is added to the timestep embedding;
- the unconditional half of classifier-free guidance is a constant built from two small MLPs applied to zeros
  (the release's T5 / OpenCLIP branches with their inputs removed), see :meth:`unconditional_tokens`.

Everything else is diffusers' CogVideoX 1.0 parts, so the SAT -> diffusers key mapping of
``convert_cogvideox_to_diffusers.py`` applies to the shared layers.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import ClassVar

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.embeddings import TimestepEmbedding, Timesteps, get_3d_sincos_pos_embed
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.normalization import AdaLayerNorm
from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock
from torch import nn

from worker.pipeline.config import DecoderConfig
from worker.pipeline.step_cache import StepCache

logger = logging.getLogger(__name__)

# LayerNorm eps, as the release's weights were trained with (TencentARC/AnimeGamer VDM_Decoder/):
# - the blocks' two norms and the final norm: 1e-5. dit_video_concat.py hands SAT `partial(LayerNorm, eps=1e-6)`,
#   but sgm/models/sat_ours/transformer.py builds input_layernorm, post_attention_layernorm and final_layernorm as
#   `layernorm(hidden_size, eps=layernorm_epsilon)`, and that keyword overrides the partial's; layernorm_epsilon is
#   ARGS_DEFAULT's 1e-5 (sat_ours/transformer_defaults.py), which configs/cogvideox_2b.yaml does not set.
# - the output adaLN's norm (FinalLayerMixin.norm_final in dit_video_concat.py): 1e-6, an nn.LayerNorm of its own.
# - the per-head q and k norms (AdaLNMixin's query/key_layernorm_list): 1e-6, which diffusers' CogVideoXBlock
#   gives its Attention whatever norm_eps says.
BLOCK_LAYERNORM_EPS = 1e-5
OUTPUT_LAYERNORM_EPS = 1e-6


def position_table(
    hidden: int, grid: tuple[int, int, int], scales: tuple[float, float], device: torch.device | None = None
) -> torch.Tensor:
    """The 3D sin-cos table the decoder adds to its video tokens, for a `frames x height x width` token `grid` (after
    patching), with the (spatial, temporal) interpolation `scales`: `(F*h*w, hidden)`, frame-major
    like the patch tokens. The toy model's clip encoder gives its latent slots the same positions, so the decoder
    can match each slot to its place from the first layer on."""
    frames, height, width = grid
    table = get_3d_sincos_pos_embed(
        hidden,
        (width, height),  # diffusers takes (width, height)
        frames,
        spatial_interpolation_scale=scales[0],
        temporal_interpolation_scale=scales[1],
        device=device,
    )  # (F, h*w, D)
    return table.flatten(0, 1)


class AnimeGamerDecoder(ModelMixin, ConfigMixin):
    """CogVideoX-2B-shaped DiT that predicts v for a video latent from 226 condition tokens and a motion scope.

    Parameters:
        num_layers (`int`, defaults to `30`): transformer blocks.
        num_heads (`int`, defaults to `30`): attention heads; hidden size is `num_heads * head_dim`.
        head_dim (`int`, defaults to `64`): channels per head.
        time_embed_dim (`int`, defaults to `512`): width of the timestep (+ motion-scope) embedding that drives adaLN.
        latent_channels (`int`, defaults to `16`): channels of the VAE latent, in and out.
        patch_size (`int`, defaults to `2`): spatial patch size of the per-frame patch embedding.
        text_embed_dim (`int`, defaults to `4096`): input width of `text_proj` (T5-XXL's), used only for the
            constant unconditional tokens.
        ip_embed_dim (`int`, defaults to `768`): input width of `ip_proj` (OpenCLIP's), likewise.
        num_text_tokens (`int`, defaults to `30`): text slots of the condition.
        num_ip_tokens (`int`, defaults to `196`): image slots of the condition.
        spatial_interpolation_scale (`float`, defaults to `1.875`): divides the spatial positions of the 3D
            sin-cos table (CogVideoX's value for 60 x 90 latents).
        temporal_interpolation_scale (`float`, defaults to `1.0`): divides the temporal positions.
    """

    _no_split_modules: ClassVar[list[str]] = ["CogVideoXBlock"]
    _supports_gradient_checkpointing = True  # training (training/character_decoder.py): one block kept at a time

    @register_to_config
    def __init__(
        self,
        num_layers: int = 30,
        num_heads: int = 30,
        head_dim: int = 64,
        time_embed_dim: int = 512,
        latent_channels: int = 16,
        patch_size: int = 2,
        text_embed_dim: int = 4096,
        ip_embed_dim: int = 768,
        num_text_tokens: int = 30,
        num_ip_tokens: int = 196,
        spatial_interpolation_scale: float = 1.875,
        temporal_interpolation_scale: float = 1.0,
    ) -> None:
        super().__init__()
        hidden = num_heads * head_dim
        # The 3D sin-cos table gives 3/4 of the channels to (h, w) halves and 1/4 to time, each a sin|cos pair.
        if hidden % 16:
            raise ValueError(f"num_heads * head_dim must be a multiple of 16 for the 3D position table, got {hidden}")
        if patch_size < 1:
            raise ValueError(f"patch_size must be positive, got {patch_size}")

        # 1. Patch embedding: one Conv2d per latent frame, (C, H, W) -> (hidden, H/p, W/p)
        self.patch_embed = nn.Conv2d(latent_channels, hidden, kernel_size=patch_size, stride=patch_size, bias=True)

        # 2. Timestep and motion-scope embeddings (both sinusoidal, cos first, then an MLP to time_embed_dim)
        self.time_proj = Timesteps(hidden, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embedding = TimestepEmbedding(hidden, time_embed_dim, "silu")
        self.flow_proj = Timesteps(hidden, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.flow_embedding = TimestepEmbedding(hidden, time_embed_dim, "silu")

        # 3. Transformer blocks with expert adaLN (separate shift/scale/gate for condition and video tokens)
        self.transformer_blocks = nn.ModuleList(
            [
                CogVideoXBlock(
                    dim=hidden,
                    num_attention_heads=num_heads,
                    attention_head_dim=head_dim,
                    time_embed_dim=time_embed_dim,
                    activation_fn="gelu-approximate",
                    attention_bias=True,
                    qk_norm=True,
                    norm_elementwise_affine=True,
                    norm_eps=BLOCK_LAYERNORM_EPS,  # norm1, norm2; the qk norms are CogVideoXBlock's 1e-6
                )
                for _ in range(num_layers)
            ]
        )
        self.norm_final = nn.LayerNorm(hidden, eps=BLOCK_LAYERNORM_EPS, elementwise_affine=True)

        # 4. Output: adaLN with the time embedding, then back to patch pixels of the latent
        self.norm_out = AdaLayerNorm(
            embedding_dim=time_embed_dim,
            output_dim=2 * hidden,
            norm_elementwise_affine=True,
            norm_eps=OUTPUT_LAYERNORM_EPS,
            chunk_dim=1,
        )
        self.proj_out = nn.Linear(hidden, patch_size * patch_size * latent_channels)

        # 5. The constant unconditional condition (the release's text/image branches fed with zeros)
        self.text_proj = nn.Sequential(nn.Linear(text_embed_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.text_norm = nn.LayerNorm(hidden)
        self.ip_proj = nn.Sequential(nn.Linear(ip_embed_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.ip_norm = nn.LayerNorm(hidden)

        # Position tables depend on the latent size actually used; built on first use, never saved.
        self._pos_embed_cache: dict[tuple[int, int, int, torch.device], torch.Tensor] = {}
        self.gradient_checkpointing = False  # enable_gradient_checkpointing() turns it on for training

    @classmethod
    def from_pipeline_config(cls, cfg: DecoderConfig) -> AnimeGamerDecoder:
        return cls(**dataclasses.asdict(cfg))

    @property
    def hidden_size(self) -> int:
        return self.config.num_heads * self.config.head_dim

    @property
    def num_condition_tokens(self) -> int:
        return self.config.num_text_tokens + self.config.num_ip_tokens

    @torch.no_grad()
    def unconditional_tokens(self, batch_size: int = 1) -> torch.Tensor:
        """The negative condition of CFG: what the release's conditioner yields when its encoders' outputs are zero.

        Returns a tensor of shape `(batch_size, num_text_tokens + num_ip_tokens, hidden)`.
        """
        weight = self.text_proj[0].weight
        text = torch.zeros(
            self.config.num_text_tokens, self.config.text_embed_dim, device=weight.device, dtype=weight.dtype
        )
        image = torch.zeros(
            self.config.num_ip_tokens, self.config.ip_embed_dim, device=weight.device, dtype=weight.dtype
        )
        tokens = torch.cat([self.text_norm(self.text_proj(text)), self.ip_norm(self.ip_proj(image))], dim=0)  # (226, D)
        return tokens.unsqueeze(0).expand(batch_size, -1, -1).contiguous()  # (B, 226, D)

    def _position_embedding(self, frames: int, height: int, width: int, device: torch.device) -> torch.Tensor:
        key = (frames, height, width, device)
        if key not in self._pos_embed_cache:
            scales = (self.config.spatial_interpolation_scale, self.config.temporal_interpolation_scale)
            self._pos_embed_cache[key] = position_table(self.hidden_size, (frames, height, width), scales, device)
        return self._pos_embed_cache[key]

    def _check_inputs(
        self, latents: torch.Tensor, timestep: torch.Tensor, condition: torch.Tensor, flow: torch.Tensor
    ) -> None:
        if latents.ndim != 5:
            raise ValueError(
                f"latents must be (batch, frames, channels, height, width), got shape {tuple(latents.shape)}"
            )
        batch, _, channels, height, width = latents.shape
        p = self.config.patch_size
        if channels != self.config.latent_channels:
            raise ValueError(f"latents have {channels} channels; this decoder expects {self.config.latent_channels}")
        if height % p or width % p:
            raise ValueError(f"latent height and width must be divisible by patch_size={p}, got {height}x{width}")
        if condition.ndim != 3 or condition.shape[0] != batch:
            raise ValueError(f"condition must be (batch={batch}, tokens, hidden), got shape {tuple(condition.shape)}")
        if condition.shape[2] != self.hidden_size:
            raise ValueError(
                f"condition width {condition.shape[2]} != decoder hidden size {self.hidden_size}; "
                "pass the MLLM representation after output_resampler"
            )
        if condition.shape[1] != self.num_condition_tokens:
            raise ValueError(f"condition must have {self.num_condition_tokens} tokens, got {condition.shape[1]}")
        for name, value in (("timestep", timestep), ("flow", flow)):
            if value.shape != (batch,):
                raise ValueError(
                    f"{name} must have shape ({batch},), one value per batch item, got {tuple(value.shape)}"
                )

    def _block(
        self, block: nn.Module, video: torch.Tensor, cond: torch.Tensor, emb: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block; when training with gradient checkpointing, its activations are recomputed in the backward
        pass instead of kept (its inputs are all it keeps)."""
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return self._gradient_checkpointing_func(block, video, cond, emb)
        return block(hidden_states=video, encoder_hidden_states=cond, temb=emb)

    def forward(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        condition: torch.Tensor,
        flow: torch.Tensor,
        cache: StepCache | None = None,
    ) -> torch.Tensor:
        """Predict v for noisy latents.

        Args:
            latents: `(batch_size, num_frames, channels, height, width)` noisy VAE latents (scaled).
            timestep: `(batch_size,)` diffusion timesteps in [0, 1000).
            condition: `(batch_size, 226, hidden)` condition tokens (MLLM representation or `unconditional_tokens`).
            flow: `(batch_size,)` motion-scope values (ANIMEGAMER.md: 0.5 ... 40).
            cache: this turn's step cache, when the blocks after the first may be reused from an earlier step.

        Returns:
            `(batch_size, num_frames, channels, height, width)` v-prediction.
        """
        # 1. Validate
        self._check_inputs(latents, timestep, condition, flow)
        batch, frames, channels, height, width = latents.shape
        p = self.config.patch_size

        # 2. Time embedding + motion-scope embedding
        # The sinusoidal projections have no weights and always return float32; the MLPs may run in half precision.
        t_emb = self.time_embedding(self.time_proj(timestep).to(latents.dtype))  # (B, E)
        f_emb = self.flow_embedding(self.flow_proj(flow).to(latents.dtype))  # (B, E)
        emb = t_emb + f_emb  # (B, E)

        # 3. Patch embedding + absolute 3D position embedding (video tokens only; condition tokens are used as is)
        video = self.patch_embed(latents.reshape(batch * frames, channels, height, width))  # (B*F, D, H/p, W/p)
        video = video.reshape(batch, frames, *video.shape[1:])  # (B, F, D, h, w)
        video = video.flatten(3).transpose(2, 3).flatten(1, 2)  # (B, F*h*w, D)
        pos = self._position_embedding(frames, height // p, width // p, latents.device)
        video = video + pos.to(video.dtype)  # table is float32; match the activations
        cond = condition.to(video.dtype)  # (B, 226, D)

        # 4. Transformer blocks over [condition ; video], full attention, no mask; with a step cache the blocks
        # after the first may add the residual they added at an earlier step instead (step_cache.py)
        first, *rest = self.transformer_blocks
        before = video
        video, cond = self._block(first, video, cond, emb)
        if cache is not None and cache.reusable(video - before):
            video, cond = video + cache.rest_video, cond + cache.rest_condition
            cache.reused += 1
        else:
            after_first, cond_after_first = video, cond
            for block in rest:
                video, cond = self._block(block, video, cond, emb)
            if cache is not None:
                cache.store(after_first - before, video - after_first, cond - cond_after_first)

        # 5. Final norm, adaLN, projection. LayerNorm is per token, so normalising the video tokens alone equals
        # normalising the concatenated sequence and keeping its video part (what CogVideoX 1.0 does).
        video = self.norm_final(video)  # (B, F*h*w, D)
        video = self.norm_out(video, temb=emb)
        video = self.proj_out(video)  # (B, F*h*w, C*p*p)

        # 6. Unpatchify: (B, F*h*w, C*p*p) -> (B, F, C, H, W)
        out = video.reshape(batch, frames, height // p, width // p, channels, p, p)
        out = out.permute(0, 1, 4, 2, 5, 3, 6)  # (B, F, C, h, p, w, p)
        out = out.flatten(5, 6).flatten(3, 4)  # (B, F, C, H, W)
        return out
