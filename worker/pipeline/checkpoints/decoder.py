"""Load the release's SAT decoder checkpoint (``VDM_Decoder-<Character>``) into :class:`AnimeGamerDecoder`.

The release saves its SwissArmyTransformer (SAT) ``SATVideoDiffusionEngine`` as

    <dir>/latest                                 the step folder's name (SAT's tracker file)
    <dir>/<step>/mp_rank_00_model_states.pt      {'module': state_dict, ...} (torch.save)

and the DiT's keys start with ``model.diffusion_model.``. Key naming, read from the release's
``VDM_Decoder/dit_video_concat.py`` and ``sgm/models/sat_ours/transformer.py``, SAT's ``sat/model/finetune/lora2.py``
and diffusers' ``scripts/convert_cogvideox_to_diffusers.py`` (SAT name, after the prefix -> ours):

    mixins.patch_embed.proj                              -> patch_embed (Conv2d)
    time_embed.{0,2} / flow_embed.{0,2}                  -> time_embedding / flow_embedding .linear_{1,2}
    transformer.layers.{i}.input_layernorm               -> transformer_blocks.{i}.norm1.norm
    transformer.layers.{i}.post_attention_layernorm      -> transformer_blocks.{i}.norm2.norm
    transformer.layers.{i}.attention.query_key_value     -> attn1.to_q / to_k / to_v (fused rows [q; k; v], LoRA)
    transformer.layers.{i}.attention.dense               -> attn1.to_out.0 (LoRA)
    transformer.layers.{i}.mlp.dense_h_to_4h / 4h_to_h   -> ff.net.0.proj / ff.net.2
    mixins.adaln_layer.query_layernorm_list.{i}          -> transformer_blocks.{i}.attn1.norm_q (key_... -> norm_k)
    mixins.adaln_layer.adaLN_modulations.{i}.1           -> norm1.linear and norm2.linear (12 chunks, see _AdaLN)
    transformer.final_layernorm                          -> norm_final
    mixins.final_layer.norm_final / adaLN_modulation.1   -> norm_out.norm / norm_out.linear
    mixins.final_layer.linear                            -> proj_out
    mixins.patch_embed.text_proj.{0,2} / ip_proj.{0,2}   -> text_proj.{0,2} / ip_proj.{0,2}
    mixins.patch_embed.txt_mix_layer_norm / ip_mix_...   -> text_norm / ip_norm

LoRA (SAT lora2): a wrapped linear saves ``<name>.original.weight`` / ``.original.bias`` and, per output partition i
(3 for the fused qkv, 1 for dense), ``<name>.matrix_A.i`` (r, in) and ``<name>.matrix_B.i`` (out / partitions, r);
partition i of the merged weight is ``original_i + B_i @ A_i * lora_alpha / r``. Merged here once, at load.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.files import RELEASE_EVERY, hand_back, load_torch_file, resolve_decoder_file
from worker.pipeline.config import DecoderConfig
from worker.pipeline.decoder import AnimeGamerDecoder

logger = logging.getLogger(__name__)

DIT_PREFIX = "model.diffusion_model."
# SAT lora2's LoraMixin default; the release's cogvideox_2b.yaml sets only r (64), so the scale is 1/64.
LORA_ALPHA = 1.0

# Whole sub-models of the release's SATVideoDiffusionEngine that inference does not use: skipped by rule.
SKIPPED_PREFIXES: dict[str, str] = {
    "conditioner.": "the T5-XXL text encoder: the MLLM representation replaces its output, the negative is zeros",
    "clip_img_encoder.": "the OpenCLIP image encoder: likewise replaced (its negative is zeros too)",
    "first_stage_model.": "a copy of the VAE: loaded from vae/3d-vae.pt instead",
}
_MIX_NORM_UNUSED = "built by the release, used only for image widths other than 768 (with mix_proj)"
# DiT tensors that are not weights our module holds: dropped by rule.
DROPPED_DIT_KEYS: dict[str, str] = {
    "mixins.pos_embed.pos_embedding": "the fixed 3D sin-cos table, recomputed for the latent size in use",
    "transformer.position_embeddings.weight": "SAT's token position table (the release deletes it at build time)",
    "transformer.word_embeddings.weight": "SAT's token embedding placeholder (the patch embedding replaces it)",
    "mixins.patch_embed.output_mix_layer_norm.weight": _MIX_NORM_UNUSED,
    "mixins.patch_embed.output_mix_layer_norm.bias": _MIX_NORM_UNUSED,
}

_LAYER_KEY = re.compile(re.escape(DIT_PREFIX) + r"transformer\.layers\.(\d+)\.")
_MAX_LISTED = 8  # keys named in one error message; the count of the rest follows

Shape = tuple[int, ...]


def skip_reason(key: str) -> str | None:
    """Why a tensor of the release file is not loaded, or None when the decoder needs it."""
    for prefix, reason in SKIPPED_PREFIXES.items():
        if key.startswith(prefix):
            return reason
    if key.startswith(DIT_PREFIX):
        return DROPPED_DIT_KEYS.get(key[len(DIT_PREFIX) :])
    return None


# --------------------------------------------------------------------------------------------------------------------
# Reading files (shared with the VAE loader)


def sat_module_state(checkpoint: Mapping[str, Any], path: Path | str) -> dict[str, torch.Tensor]:
    """The ``module`` state dict of a SAT checkpoint, checked to be a dict of tensors."""
    state = checkpoint.get("module")
    if not isinstance(state, dict):
        raise CheckpointError(path, "has no 'module' state dict", "{'module': state_dict} as SAT saves it")
    not_tensors = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise CheckpointError(path, f"'module' holds non-tensors under {_listed(not_tensors)}", "tensors only")
    return state


# --------------------------------------------------------------------------------------------------------------------
# Sizes


def _shape(state: Mapping[str, torch.Tensor], path: Path | str, key: str, ndim: int, why: str) -> Shape:
    tensor = state.get(key)
    if tensor is None:
        raise CheckpointError(path, f"missing tensor {key}", f"a {ndim}-d tensor ({why})")
    if tensor.ndim != ndim:
        raise CheckpointError(path, f"tensor {key} has shape {list(tensor.shape)}", f"a {ndim}-d tensor ({why})")
    return tuple(tensor.shape)


def decoder_config_from_state(
    state: Mapping[str, torch.Tensor], path: Path | str = "<state dict>", *, defaults: DecoderConfig | None = None
) -> DecoderConfig:
    """The decoder's sizes, read from the tensor shapes of a SAT ``module`` state dict.

    Fields the weights cannot tell (condition token counts, position-table interpolation) come from ``defaults``
    (the release's values when None).
    """
    p = DIT_PREFIX
    hidden, latent_channels, patch, patch_w = _shape(state, path, p + "mixins.patch_embed.proj.weight", 4, "patches")
    (head_dim,) = _shape(state, path, p + "mixins.adaln_layer.query_layernorm_list.0.weight", 1, "per-head q norm")
    time_embed_dim, _ = _shape(state, path, p + "time_embed.0.weight", 2, "timestep MLP")
    _, text_embed_dim = _shape(state, path, p + "mixins.patch_embed.text_proj.0.weight", 2, "text projection")
    _, ip_embed_dim = _shape(state, path, p + "mixins.patch_embed.ip_proj.0.weight", 2, "image projection")
    layers = {int(m.group(1)) for key in state if (m := _LAYER_KEY.match(key))}
    if not layers:
        raise CheckpointError(path, "has no transformer layers", f"keys {p}transformer.layers.<i>.*")
    if patch != patch_w:
        raise CheckpointError(path, f"patch embedding kernel is {patch}x{patch_w}", "a square patch")
    if hidden % head_dim:
        raise CheckpointError(path, f"hidden size {hidden} is not a multiple of the head size {head_dim}", "heads")
    return replace(
        defaults or DecoderConfig(),
        num_layers=max(layers) + 1,  # a gap in the indices then shows up as missing tensors
        num_heads=hidden // head_dim,
        head_dim=head_dim,
        time_embed_dim=time_embed_dim,
        latent_channels=latent_channels,
        patch_size=patch,
        text_embed_dim=text_embed_dim,
        ip_embed_dim=ip_embed_dim,
    )


def _lora_rank(state: Mapping[str, torch.Tensor], path: Path | str) -> int:
    key = DIT_PREFIX + "transformer.layers.0.attention.query_key_value.matrix_A.0"
    rank, _ = _shape(state, path, key, 2, "LoRA down matrix (rank, in), SAT lora2")
    return rank


# --------------------------------------------------------------------------------------------------------------------
# The mapping, as rules: each names the SAT tensors it reads (with shapes) and yields ours


class _Rule(Protocol):
    def sources(self) -> dict[str, Shape]: ...

    def apply(
        self, state: Mapping[str, torch.Tensor], dtype: torch.dtype | None, device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor]]: ...


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    # Always a copy: nothing we return may keep the memory-mapped file alive or change with it.
    return tensor.to(device=device, dtype=dtype or tensor.dtype, copy=True)


@dataclass(frozen=True)
class _Copy:
    src: str
    dst: str
    shape: Shape

    def sources(self) -> dict[str, Shape]:
        return {self.src: self.shape}

    def apply(
        self, state: Mapping[str, torch.Tensor], dtype: torch.dtype | None, device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor]]:
        yield self.dst, _cast(state[self.src], dtype, device)


@dataclass(frozen=True)
class _LoraLinear:
    """A SAT lora2 ``LoraLinear``: ``original`` plus one (A, B) pair per output partition, merged and split."""

    src: str
    dsts: tuple[str, ...]  # one of our Linears per partition, in row order
    in_features: int
    out_features: int  # per partition
    rank: int

    def sources(self) -> dict[str, Shape]:
        n = len(self.dsts)
        shapes = {
            f"{self.src}.original.weight": (n * self.out_features, self.in_features),
            f"{self.src}.original.bias": (n * self.out_features,),
        }
        for i in range(n):
            shapes[f"{self.src}.matrix_A.{i}"] = (self.rank, self.in_features)
            shapes[f"{self.src}.matrix_B.{i}"] = (self.out_features, self.rank)
        return shapes

    def apply(
        self, state: Mapping[str, torch.Tensor], dtype: torch.dtype | None, device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor]]:
        weight = state[f"{self.src}.original.weight"]
        bias = state[f"{self.src}.original.bias"]
        scale = LORA_ALPHA / self.rank
        n = len(self.dsts)
        for i, (w, b, dst) in enumerate(zip(weight.chunk(n), bias.chunk(n), self.dsts, strict=True)):
            a_i = state[f"{self.src}.matrix_A.{i}"].to(device=device, dtype=torch.float32)  # (r, in)
            b_i = state[f"{self.src}.matrix_B.{i}"].to(device=device, dtype=torch.float32)  # (out, r)
            # Merged on the device, in float32 whatever the file's precision, then cast once.
            merged = w.to(device=device, dtype=torch.float32, copy=True)  # (out, in)
            merged.addmm_(b_i, a_i, alpha=scale)
            yield f"{dst}.weight", merged.to(dtype or weight.dtype)
            yield f"{dst}.bias", _cast(b, dtype, device)


@dataclass(frozen=True)
class _AdaLN:
    """The release's per-layer ``Linear(E -> 12 D)`` split into diffusers' two ``CogVideoXLayerNormZero`` linears.

    The release chunks it 12 ways as (shift, scale, gate) x (attention, MLP) for the video tokens, then the same six
    for the condition ("text") tokens. ``CogVideoXLayerNormZero.linear`` emits shift, scale, gate, enc_shift,
    enc_scale, enc_gate, so norm1 (attention) = chunks [0:3] + [6:9] and norm2 (MLP) = [3:6] + [9:12], as in
    diffusers' converter.
    """

    src: str
    norm1: str
    norm2: str
    hidden: int
    time_embed_dim: int

    def sources(self) -> dict[str, Shape]:
        return {
            f"{self.src}.weight": (12 * self.hidden, self.time_embed_dim),
            f"{self.src}.bias": (12 * self.hidden,),
        }

    def apply(
        self, state: Mapping[str, torch.Tensor], dtype: torch.dtype | None, device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for kind in ("weight", "bias"):
            chunks = state[f"{self.src}.{kind}"].to(device).chunk(12)  # on the device: the meta device reads nothing
            yield f"{self.norm1}.{kind}", torch.cat(chunks[0:3] + chunks[6:9]).to(dtype or chunks[0].dtype)
            yield f"{self.norm2}.{kind}", torch.cat(chunks[3:6] + chunks[9:12]).to(dtype or chunks[0].dtype)


def _plan(cfg: DecoderConfig, rank: int) -> list[_Rule]:
    """Every rule that builds the decoder's state dict from the release's, for these sizes."""
    p = DIT_PREFIX
    d, e, c, k = cfg.hidden_size, cfg.time_embed_dim, cfg.latent_channels, cfg.patch_size
    rules: list[_Rule] = []

    def linear(src: str, dst: str, out_features: int, in_features: int) -> None:
        rules.append(_Copy(f"{p}{src}.weight", f"{dst}.weight", (out_features, in_features)))
        rules.append(_Copy(f"{p}{src}.bias", f"{dst}.bias", (out_features,)))

    def norm(src: str, dst: str, width: int) -> None:
        rules.append(_Copy(f"{p}{src}.weight", f"{dst}.weight", (width,)))
        rules.append(_Copy(f"{p}{src}.bias", f"{dst}.bias", (width,)))

    # 1. Patch embedding: Conv2d(C -> D, kernel = stride = patch)
    rules.append(_Copy(f"{p}mixins.patch_embed.proj.weight", "patch_embed.weight", (d, c, k, k)))
    rules.append(_Copy(f"{p}mixins.patch_embed.proj.bias", "patch_embed.bias", (d,)))

    # 2. Timestep and motion-scope MLPs
    for sat, ours in (("time_embed", "time_embedding"), ("flow_embed", "flow_embedding")):
        linear(f"{sat}.0", f"{ours}.linear_1", e, d)
        linear(f"{sat}.2", f"{ours}.linear_2", e, e)

    # 3. Transformer blocks
    for i in range(cfg.num_layers):
        sat, ours = f"transformer.layers.{i}", f"transformer_blocks.{i}"
        norm(f"{sat}.input_layernorm", f"{ours}.norm1.norm", d)
        qkv = tuple(f"{ours}.attn1.to_{x}" for x in "qkv")
        rules.append(_LoraLinear(f"{p}{sat}.attention.query_key_value", qkv, d, d, rank))
        rules.append(_LoraLinear(f"{p}{sat}.attention.dense", (f"{ours}.attn1.to_out.0",), d, d, rank))
        norm(f"mixins.adaln_layer.query_layernorm_list.{i}", f"{ours}.attn1.norm_q", cfg.head_dim)
        norm(f"mixins.adaln_layer.key_layernorm_list.{i}", f"{ours}.attn1.norm_k", cfg.head_dim)
        norm(f"{sat}.post_attention_layernorm", f"{ours}.norm2.norm", d)
        linear(f"{sat}.mlp.dense_h_to_4h", f"{ours}.ff.net.0.proj", 4 * d, d)
        linear(f"{sat}.mlp.dense_4h_to_h", f"{ours}.ff.net.2", d, 4 * d)
        adaln = f"{p}mixins.adaln_layer.adaLN_modulations.{i}.1"
        rules.append(_AdaLN(adaln, f"{ours}.norm1.linear", f"{ours}.norm2.linear", d, e))

    # 4. Final norms and output projection
    norm("transformer.final_layernorm", "norm_final", d)
    norm("mixins.final_layer.norm_final", "norm_out.norm", d)
    linear("mixins.final_layer.adaLN_modulation.1", "norm_out.linear", 2 * d, e)
    linear("mixins.final_layer.linear", "proj_out", k * k * c, d)

    # 5. The text / image branches that build the constant unconditional tokens
    for sat, ours, width in (("text_proj", "text_proj", cfg.text_embed_dim), ("ip_proj", "ip_proj", cfg.ip_embed_dim)):
        linear(f"mixins.patch_embed.{sat}.0", f"{ours}.0", d, width)
        linear(f"mixins.patch_embed.{sat}.2", f"{ours}.2", d, d)
    norm("mixins.patch_embed.txt_mix_layer_norm", "text_norm", d)
    norm("mixins.patch_embed.ip_mix_layer_norm", "ip_norm", d)
    return rules


# --------------------------------------------------------------------------------------------------------------------
# Checking and converting


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED])
    return shown + (f" and {len(keys) - _MAX_LISTED} more" if len(keys) > _MAX_LISTED else "")


def check_sources(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, Shape],
    path: Path | str,
    skip: Callable[[str], str | None],
    layout: str,
) -> None:
    """Raise one CheckpointError for missing, wrongly shaped or unexpected tensors (in that order)."""
    missing = [k for k in expected if k not in state]
    if missing:
        named = [f"{k} {list(expected[k])}" for k in missing]
        raise CheckpointError(path, f"missing {len(missing)} tensor(s): {_listed(named)}", f"the {layout}")
    wrong = [k for k, shape in expected.items() if tuple(state[k].shape) != shape]
    if wrong:
        found = [f"{k} has shape {list(state[k].shape)}, expected {list(expected[k])}" for k in wrong]
        raise CheckpointError(path, f"wrong shape: {_listed(found)}", f"the shapes of the {layout}")
    unexpected = [k for k in state if k not in expected and skip(k) is None]
    if unexpected:
        raise CheckpointError(path, f"unexpected tensor(s): {_listed(unexpected)}", f"only the {layout}")


def _convert(
    state: Mapping[str, torch.Tensor],
    path: Path | str,
    dtype: torch.dtype | None,
    defaults: DecoderConfig | None,
    device: torch.device,
) -> tuple[DecoderConfig, dict[str, torch.Tensor]]:
    cfg = decoder_config_from_state(state, path, defaults=defaults)
    rules = _plan(cfg, _lora_rank(state, path))
    expected = {key: shape for rule in rules for key, shape in rule.sources().items()}
    layout = f"SAT AnimeGamer decoder layout ({cfg.num_layers} layers, hidden {cfg.hidden_size}, read from this file)"
    check_sources(state, expected, path, skip_reason, layout)
    converted: dict[str, torch.Tensor] = {}
    read = 0
    for rule in rules:
        converted.update(rule.apply(state, dtype, device))
        read += sum(state[key].nbytes for key in rule.sources())
        if read >= RELEASE_EVERY:  # the file's pages read so far go back (converted tensors are copies)
            hand_back(path)
            read = 0
    hand_back(path)

    skipped = [k for k in state if k not in expected]
    logger.info("%s: %d decoder tensors converted, %d skipped by rule", path, len(converted), len(skipped))
    return cfg, converted


def convert_decoder_state(
    state: Mapping[str, torch.Tensor],
    path: Path | str = "<state dict>",
    *,
    dtype: torch.dtype | None = None,
    defaults: DecoderConfig | None = None,
) -> dict[str, torch.Tensor]:
    """Map a SAT ``module`` state dict to :class:`AnimeGamerDecoder`'s, merging the LoRA.

    ``dtype`` None keeps each tensor's precision (LoRA merges are computed in float32 and cast back). Tensors of
    :data:`SKIPPED_PREFIXES` and :data:`DROPPED_DIT_KEYS` are left out; any other missing, unexpected or wrongly shaped
    tensor is a :class:`CheckpointError` naming ``path`` and the keys.
    """
    return _convert(state, path, dtype, defaults, torch.device("cpu"))[1]


def load_decoder(
    path: Path | str,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    defaults: DecoderConfig | None = None,
) -> AnimeGamerDecoder:
    """Build the decoder from a release checkpoint: its directory (through ``latest``) or its model-states file.

    The whole file is checked before any weight is read, and converted before any module exists, so a bad file
    leaves nothing half-loaded. Each tensor is converted straight onto ``device`` as it is read from the memory-mapped
    file (on ``meta`` nothing is read: shapes only), and the file's pages are handed back as the conversion goes, so
    the load holds one copy of the weights. The module is built on the meta device and takes the converted tensors
    as they are (no random init of 2B parameters), in eval mode without gradients: it only serves inference.
    """
    file = resolve_decoder_file(path)
    checkpoint = load_torch_file(file)
    state = sat_module_state(checkpoint, file)
    cfg, converted = _convert(state, file, dtype, defaults, torch.device(device))
    del checkpoint, state  # drop the file mapping before the model is moved

    try:
        with torch.device("meta"):
            model = AnimeGamerDecoder.from_pipeline_config(cfg)
    except ValueError as exc:
        raise CheckpointError(
            file, f"describes a decoder we cannot build ({exc})", "CogVideoX-2B-shaped sizes"
        ) from exc
    model.load_state_dict(converted, strict=True, assign=True)
    # Filled means taken from the file (on the meta device, a conversion for shapes only is meta too).
    tensors = [*model.named_parameters(), *model.named_buffers()]
    on_meta = [name for name, t in tensors if t.is_meta and name not in converted]
    if on_meta:  # a module grew a tensor the mapping does not fill: our bug, not the file's
        raise RuntimeError(f"decoder tensors left unloaded: {on_meta}")
    return model.to(device).eval().requires_grad_(False)
