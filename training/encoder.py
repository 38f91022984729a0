"""Phase (a)'s clip encoder: a clip's VAE latents and its instruction -> the 226-token representation.

In AnimeGamer the MLLM learns to predict this representation, and the decoder turns it back into the clip; the
release builds it from frozen encoders (OpenCLIP for the image, T5 for the text). Here the frozen part is the
trained VAE: the encoder reads the clip's latents, which keep the character (its shape, colours and place in every
latent frame) where a small network trained from scratch on pixels blurred it away. Slot order matches the
decoder's condition, 30 text slots then 196 image slots:

- 30 text slots: learned queries reading the instruction's bytes;
- 120 latent slots: each of the decoder's own video tokens (a 2 x 2 patch of one latent frame) through a small MLP,
  at the decoder's own 3D sin-cos position, so the decoder can match a slot to its place from its first layer;
- 76 summary slots: learned queries reading the latent slots, a view of the whole clip (its motion).

An MLLM that predicts this representation predicts, in effect, the clip's latents: a target that says where the
figure is and how it moves, which is what the decoder needs to draw it.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from training.config import ToyModelConfig
from worker.pipeline.decoder import position_table

logger = logging.getLogger(__name__)

PAD_BYTE = 256  # byte ids are 0..255; one more id pads


def instruction_bytes(texts: list[str], max_bytes: int) -> torch.Tensor:
    """UTF-8 bytes as ids `(B, max_bytes)`, padded with PAD_BYTE; cut with a warning when too long."""
    ids = torch.full((len(texts), max_bytes), PAD_BYTE, dtype=torch.long)
    for i, text in enumerate(texts):
        data = text.encode()
        if len(data) > max_bytes:
            logger.warning("instruction cut to %d bytes: %r", max_bytes, data[max_bytes:].decode(errors="replace"))
            data = data[:max_bytes]
        if data:
            ids[i, : len(data)] = torch.tensor(list(data), dtype=torch.long)
    return ids


def latent_grid(config: ToyModelConfig) -> tuple[int, int, int]:
    """The decoder's video-token grid `(F, h, w)` for the configured clip: latent frames, latent rows / patch, ..."""
    p = config.pipeline
    patch = p.decoder.patch_size
    return p.latent_frames, p.latent_height // patch, p.latent_width // patch


class ClipEncoder(nn.Module):
    """Latents `(B, F, C, h, w)` (the scaled ones the decoder learns) + instruction bytes `(B, L)` -> `(B, 226, D)`.

    D is the decoder's hidden size.
    """

    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        dec = config.pipeline.decoder
        hidden, patch = dec.hidden_size, dec.patch_size
        grid = latent_grid(config)
        self.num_latent_slots = grid[0] * grid[1] * grid[2]
        self.num_summary_slots = dec.num_ip_tokens - self.num_latent_slots
        if self.num_summary_slots < 0:
            raise ValueError(
                f"the clip has {self.num_latent_slots} latent patches, more than {dec.num_ip_tokens} slots"
            )
        self.patch = patch

        # 1. Latent slots: each decoder patch through an MLP, at the decoder's own positions
        self.latent_mlp = nn.Sequential(
            nn.Linear(dec.latent_channels * patch * patch, config.encoder_hidden),
            nn.GELU(),
            nn.Linear(config.encoder_hidden, hidden),
        )
        scales = (dec.spatial_interpolation_scale, dec.temporal_interpolation_scale)
        self.register_buffer("latent_pos", position_table(hidden, grid, scales).float(), persistent=False)  # (120, D)

        # 2. Text slots: byte embedding with positions, read by learned queries
        self.byte_embed = nn.Embedding(PAD_BYTE + 1, hidden)
        self.byte_pos = nn.Parameter(torch.randn(config.max_instruction_bytes, hidden) * 0.02)
        self.text_queries = nn.Parameter(torch.randn(dec.num_text_tokens, hidden) * 0.02)
        self.text_attn = nn.MultiheadAttention(hidden, num_heads=2, batch_first=True)

        # 3. Summary slots: learned queries reading the latent slots
        self.summary_queries = nn.Parameter(torch.randn(self.num_summary_slots, hidden) * 0.02)
        self.summary_attn = nn.MultiheadAttention(hidden, num_heads=2, batch_first=True)

        self.norm = nn.LayerNorm(hidden)

    def forward(self, latents: torch.Tensor, instruction: torch.Tensor) -> torch.Tensor:
        B, F, C, h, w = latents.shape
        p = self.patch
        # 1. Latent slots, patched as the decoder patches: (B, F, C, h, w) -> (B, F * h/p * w/p, C * p * p)
        patches = latents.reshape(B, F, C, h // p, p, w // p, p).permute(0, 1, 3, 5, 2, 4, 6).flatten(4).flatten(1, 3)
        video = self.latent_mlp(patches) + self.latent_pos  # (B, 120, D)

        # 2. Text slots; an all-padding row would leave attention nothing to read, so its first byte stays visible
        pad = instruction == PAD_BYTE  # (B, L)
        pad[:, 0] = False
        keys = self.byte_embed(instruction) + self.byte_pos[: instruction.shape[1]]  # (B, L, D)
        queries = self.text_queries.expand(B, -1, -1)
        text, _ = self.text_attn(queries, keys, keys, key_padding_mask=pad, need_weights=False)

        # 3. Summary slots over the latent slots
        queries = self.summary_queries.expand(B, -1, -1)  # (B, 76, D)
        summary, _ = self.summary_attn(queries, video, video, need_weights=False)

        return self.norm(torch.cat([text, video, summary + queries], dim=1))  # (B, 226, D)
