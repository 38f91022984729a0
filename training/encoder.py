"""Phase (a)'s clip encoder: an animation clip and its instruction -> the 226-token representation.

In AnimeGamer the MLLM learns to predict this representation; phase (a) learns it by reconstruction, the decoder
turning it back into the clip. The visual part comes from 3D convolutions over the whole clip, so motion (not only
appearance) can reach the decoder; the text part reads the instruction's bytes. Slot order matches the decoder's
condition: 30 text slots, then 196 image slots.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.nn import functional as F

from training.config import ToyModelConfig

logger = logging.getLogger(__name__)

PAD_BYTE = 256  # byte ids are 0..255; one more id pads
VISUAL_GRID = (4, 7, 7)  # (time, height, width) of the pooled visual tokens: 4 * 7 * 7 = 196


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


class ClipEncoder(nn.Module):
    """Clip `(B, 17, 3, 64, 96)` in [-1, 1] + instruction bytes `(B, L)` -> representation `(B, 226, D)`.

    D is the decoder's hidden size; the text slots are learned queries attending to the embedded bytes.
    """

    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        dec = config.pipeline.decoder
        hidden = dec.hidden_size
        c = config.encoder_channels
        grid = VISUAL_GRID[0] * VISUAL_GRID[1] * VISUAL_GRID[2]
        assert grid == dec.num_ip_tokens, f"the visual grid gives {grid} tokens, the decoder wants {dec.num_ip_tokens}"
        assert hidden % 2 == 0, f"hidden size must be even for two attention heads, got {hidden}"
        self.num_text_tokens = dec.num_text_tokens

        # 1. Visual: two strided 3D convs, then pooled to the 4 x 7 x 7 grid
        self.visual = nn.Sequential(
            nn.Conv3d(3, c, kernel_size=(3, 4, 4), stride=(2, 4, 4), padding=(1, 0, 0)),  # (B, c, 9, 16, 24)
            nn.GELU(),
            nn.Conv3d(c, hidden, kernel_size=(3, 2, 2), stride=(2, 2, 2), padding=(1, 0, 0)),  # (B, D, 5, 8, 12)
        )

        # 2. Text: byte embedding with positions, read by learned queries
        self.byte_embed = nn.Embedding(PAD_BYTE + 1, hidden)
        self.byte_pos = nn.Parameter(torch.randn(config.max_instruction_bytes, hidden) * 0.02)
        self.text_queries = nn.Parameter(torch.randn(dec.num_text_tokens, hidden) * 0.02)
        self.text_attn = nn.MultiheadAttention(hidden, num_heads=2, batch_first=True)

        # 3. One learned position per output slot, then a norm
        self.slot_pos = nn.Parameter(torch.randn(dec.num_text_tokens + grid, hidden) * 0.02)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, clip: torch.Tensor, instruction: torch.Tensor) -> torch.Tensor:
        B = clip.shape[0]  # clip: (B, T, 3, H, W)
        # 1. Visual tokens
        v = self.visual(clip.permute(0, 2, 1, 3, 4))  # (B, D, 5, 8, 12)
        v = F.adaptive_avg_pool3d(v, VISUAL_GRID)  # (B, D, 4, 7, 7)
        v = v.flatten(2).transpose(1, 2)  # (B, 196, D)

        # 2. Text tokens; an all-padding row would leave attention nothing to read, so its first byte stays visible
        pad = instruction == PAD_BYTE  # (B, L)
        pad[:, 0] = False
        keys = self.byte_embed(instruction) + self.byte_pos[: instruction.shape[1]]  # (B, L, D)
        queries = self.text_queries.expand(B, -1, -1)  # (B, 30, D)
        t, _ = self.text_attn(queries, keys, keys, key_padding_mask=pad, need_weights=False)  # (B, 30, D)

        # 3. [text ; visual] + slot positions
        return self.norm(torch.cat([t, v], dim=1) + self.slot_pos)  # (B, 226, D)
