"""The clip encoder's frozen half: T5 for a clip's text and OpenCLIP for its image, read from the release's files.

Phase (a) conditions the decoder on the clip's T5 features (30 tokens) and OpenCLIP image features (196 patches),
through the decoder's own projections (``training.character_decoder.clip_condition``). At inference the MLLM's
representation takes their place, so the worker never loads them (ANIMEGAMER.md); training a character does, once
over the data set, before the phases run. The release's decoder file carries both, frozen, beside the DiT:

    conditioner.embedders.0.transformer.<T5EncoderModel key>      FrozenT5Embedder (T5 v1.1 XXL, 4096 wide)
    clip_img_encoder.model.visual.<open_clip VisionTransformer key>   FrozenOpenCLIPImageEmbedder_196 (ViT-B/16)

(read from the release's ``VDM_Decoder/configs/cogvideox_2b.yaml`` and ``sgm/modules/encoders``). The text is cut or
padded to 30 tokens and encoded without an attention mask, as the release's embedder does; the image is taken at
224 x 224, normalised with CLIP's mean and deviation, and its features are the 196 patch tokens of the
penultimate block (the class token dropped). The T5 tokenizer is not in that file: it is the ``spiece.model``
directory the release reads it from (``t5-v1_1-xxl``), here ``<checkpoints>/t5-v1_1-xxl`` by default.

Which text and which image: each clip's instruction (``Character: ...; Motion: ...; Background: ...``) and its
first frame. The release does not publish its captions; the instruction is what the clip answers in the game.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase, T5Config, T5EncoderModel

from worker.pipeline.checkpoints.decoder import sat_module_state
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.files import load_torch_file, resolve_decoder_file

T5_PREFIX = "conditioner.embedders.0.transformer."
VISION_PREFIX = "clip_img_encoder.model.visual."
T5_TOKENIZER_DIR = "t5-v1_1-xxl"
TEXT_TOKENS = 30  # FrozenT5Embedder with is_plan_3: max_length 30, padded
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class VisionConfig:
    """open_clip's VisionTransformer, the parts the penultimate patch tokens use (ViT-B/16 by default)."""

    width: int = 768
    layers: int = 12
    heads: int = 12
    patch_size: int = 16
    image_size: int = 224

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size


class _Block(nn.Module):
    """open_clip's ResidualAttentionBlock: pre-norm attention and a GELU MLP, the same attribute names."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(c_fc=nn.Linear(width, 4 * width), gelu=nn.GELU(), c_proj=nn.Linear(4 * width, width))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class OpenCLIPVision(nn.Module):
    """The image tower up to its penultimate block: ``(B, 3, H, W)`` in [0, 1] -> ``(B, grid^2, width)``."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        w, p = config.width, config.patch_size
        self.conv1 = nn.Conv2d(3, w, kernel_size=p, stride=p, bias=False)
        self.class_embedding = nn.Parameter(torch.zeros(w))
        self.positional_embedding = nn.Parameter(torch.zeros(config.grid**2 + 1, w))
        self.ln_pre = nn.LayerNorm(w)
        self.transformer = nn.Module()
        self.transformer.resblocks = nn.ModuleList(_Block(w, config.heads) for _ in range(config.layers))
        self.register_buffer("mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        size = self.config.image_size
        x = F.interpolate(images, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
        x = (x.clamp(0, 1) - self.mean) / self.std
        x = self.conv1(x).flatten(2).transpose(1, 2)  # (B, grid^2, width)
        cls = self.class_embedding.expand(x.shape[0], 1, -1)
        x = self.ln_pre(torch.cat([cls, x], dim=1) + self.positional_embedding)  # (B, 1 + grid^2, width)
        for block in self.transformer.resblocks[:-1]:  # the release stops one block short of the last
            x = block(x)
        return x[:, 1:]


class FrozenEncoders(nn.Module):
    """Both frozen encoders and the T5 tokenizer; ``text`` and ``image`` give phase (a)'s inputs for a batch."""

    def __init__(self, t5: T5EncoderModel, tokenizer: PreTrainedTokenizerBase, vision: OpenCLIPVision) -> None:
        super().__init__()
        self.t5, self.tokenizer, self.vision = t5.eval(), tokenizer, vision.eval()
        self.requires_grad_(False)

    @torch.no_grad()
    def text(self, texts: list[str]) -> torch.Tensor:
        """``(B, 30, d_model)``: the tokens padded to 30 and encoded whole, padding included, as the release does."""
        ids = self.tokenizer(
            texts, truncation=True, max_length=TEXT_TOKENS, padding="max_length", return_tensors="pt"
        ).input_ids
        return self.t5(input_ids=ids.to(self.t5.device)).last_hidden_state.float()

    @torch.no_grad()
    def image(self, frames: torch.Tensor) -> torch.Tensor:
        """``(B, 196, width)`` from uint8 frames ``(B, H, W, 3)``."""
        images = frames.permute(0, 3, 1, 2).to(self.vision.conv1.weight.device, torch.float32) / 255.0
        return self.vision(images.to(self.vision.conv1.weight.dtype)).float()


# --------------------------------------------------------------------------------------------------------------------
# Sizes from the tensors, and loading


def _need(state: Mapping[str, torch.Tensor], path: Path, key: str, what: str) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(path, f"missing tensor {key}", what)
    return state[key]


def t5_config_from_state(state: Mapping[str, torch.Tensor], path: Path) -> T5Config:
    """T5 v1.1's sizes from its tensors (``state`` without the prefix); heads from the relative-position table."""
    what = "the T5 encoder the release's decoder file carries under " + T5_PREFIX
    vocab, d_model = _need(state, path, "shared.weight", what).shape
    bias = _need(state, path, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", what)
    buckets, heads = bias.shape
    inner = _need(state, path, "encoder.block.0.layer.0.SelfAttention.q.weight", what).shape[0]
    gated = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in state
    wi = "wi_0" if gated else "wi"
    d_ff = _need(state, path, f"encoder.block.0.layer.1.DenseReluDense.{wi}.weight", what).shape[0]
    layers = len({m.group(1) for k in state if (m := re.match(r"encoder\.block\.(\d+)\.", k))})
    return T5Config(
        vocab_size=vocab,
        d_model=d_model,
        d_kv=inner // heads,
        d_ff=d_ff,
        num_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=buckets,
        feed_forward_proj="gated-gelu" if gated else "relu",
        is_encoder_decoder=False,
        use_cache=False,
    )


def vision_config_from_state(state: Mapping[str, torch.Tensor], path: Path) -> VisionConfig:
    """The ViT's sizes from its tensors (``state`` without the prefix); heads as open_clip sets them, width / 64."""
    what = "the OpenCLIP image encoder the release's decoder file carries under " + VISION_PREFIX
    width, _, patch, _ = _need(state, path, "conv1.weight", what).shape
    positions = _need(state, path, "positional_embedding", what).shape[0]
    layers = len({m.group(1) for k in state if (m := re.match(r"transformer\.resblocks\.(\d+)\.", k))})
    grid = round((positions - 1) ** 0.5)
    if grid * grid != positions - 1 or layers < 2:
        raise CheckpointError(path, f"an image tower of {positions} positions and {layers} blocks", what)
    heads = max(1, width // 64)
    return VisionConfig(width=width, layers=layers, heads=heads, patch_size=patch, image_size=grid * patch)


def _part(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def encoders_from_state(
    state: Mapping[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase, path: Path = Path("<state dict>")
) -> FrozenEncoders:
    """Both encoders from a SAT ``module`` state dict holding them under the release's prefixes."""
    t5_state, vision_state = _part(state, T5_PREFIX), _part(state, VISION_PREFIX)
    for part, prefix in ((t5_state, T5_PREFIX), (vision_state, VISION_PREFIX)):
        if not part:
            raise CheckpointError(
                path, f"holds no {prefix}* tensors", "the release's decoder file, which carries T5 and OpenCLIP"
            )
    t5 = T5EncoderModel(t5_config_from_state(t5_state, path))
    t5_state.setdefault("encoder.embed_tokens.weight", t5_state["shared.weight"])
    t5.load_state_dict(t5_state, strict=True)
    vision = OpenCLIPVision(vision_config_from_state(vision_state, path))
    unused = ("ln_post.", "proj")  # after the last block: the penultimate tokens never reach them
    vision.load_state_dict({k: v for k, v in vision_state.items() if not k.startswith(unused)}, strict=True)
    return FrozenEncoders(t5, tokenizer, vision)


def load_frozen_encoders(decoder_dir: Path | str, tokenizer_dir: Path | str) -> FrozenEncoders:
    """T5 and OpenCLIP from a ``VDM_Decoder-<Name>`` directory (its ``latest`` step), the tokenizer from its own."""
    tokenizer_dir = Path(tokenizer_dir)
    if not tokenizer_dir.is_dir():
        raise CheckpointError(
            tokenizer_dir, "is not a directory", "the T5 v1.1 tokenizer (spiece.model) the release reads, t5-v1_1-xxl"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    path = resolve_decoder_file(decoder_dir)
    state = sat_module_state(load_torch_file(path), path)
    return encoders_from_state(state, tokenizer, path)
