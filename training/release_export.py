"""A trained character written in the release's layout, so that the release's own code and ours both read it.

``export_character`` writes both halves under a checkpoint root, beside the published characters, over the one
Mistral base they share: a worker with ``ANIMEGAMER_CHARACTERS=Qiqi,Sosuke,<Name>`` then serves it.

**The decoder.**

``VDM_Decoder-<Name>/latest`` names the step, and ``<step>/mp_rank_00_model_states.pt`` holds ``{'module': state}``
as SAT's DeepSpeed save writes it (ANIMEGAMER.md): DiT keys under ``model.diffusion_model.``, the attention's q, k
and v as one fused ``query_key_value`` (rows q; k; v), and the LoRA as SAT's lora2 holds it: the frozen
``original`` weight beside ``matrix_A.i`` (r x in) and ``matrix_B.i`` (out x r) for each partition, applied with
the scale 1 / r (lora_alpha 1). The decoder comes as the phases train it: our module with peft's LoRA on
``to_q``, ``to_k``, ``to_v`` and ``to_out.0`` (``training.character_decoder.DECODER_LORA``, the same 1 / r).

The names are written by walking the module attribute by attribute, independently of the loader's rule tables
(``worker.pipeline.checkpoints.decoder``), so that the tests' round trip through the loader checks both.

**The MLLM.** ``MLLM-<Name>/pytorch_model.bin`` is the state dict of the release's wrapper around a peft-wrapped
Mistral (``worker/pipeline/checkpoints/mllm.py`` spells its names out), holding what training changed, as a
trainer saving its trained tensors writes it: the LoRA pairs, the norms as peft's ``modules_to_save`` copies, the
input and output embeddings in full (base rows and added rows), and both resamplers under ``proj``. The frozen
base is not written: it is the shared Mistral directory's, which training started from. The release applies
LoRA at alpha / r with alpha 32 (``mistral-7b.yaml``; the file cannot say otherwise), so B carries any other scale.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from worker.pipeline.checkpoints.layout import CheckpointLayout

DIT = "model.diffusion_model."
MODEL_STATES = "mp_rank_00_model_states.pt"
LLM = "llm.base_model.model."  # PeftModelForCausalLM.base_model (LoraModel).model (MistralForCausalLM)
RELEASE_MLLM_ALPHA = 32.0
EMBEDDINGS = ("model.embed_tokens.weight", "lm_head.weight")


class ExportError(ValueError):
    """A module that cannot be written in the release's layout; the message says what it lacks."""


class NamedState:
    """SAT-named tensors, and which of the module's parameters were written (every one must be)."""

    def __init__(self, module: nn.Module) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.written: set[int] = set()
        self.module = module

    def put(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.tensors:
            raise ExportError(f"{name} would be written twice")
        self.tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()

    def module_(self, prefix: str, module: nn.Module, renames: dict[str, str] | None = None) -> None:
        for name, param in module.named_parameters():
            for old, new in (renames or {}).items():
                name = name.replace(old, new)
            self.put(prefix + name, param)
            self.written.add(id(param))

    def mark(self, *params: torch.Tensor) -> None:
        self.written.update(id(p) for p in params)

    def check_complete(self) -> None:
        left = [name for name, p in self.module.named_parameters() if id(p) not in self.written]
        if left:
            raise ExportError(f"these weights have no place in the release's layout: {', '.join(left[:8])}")


def _lora(state: NamedState, name: str, layers: list[nn.Module]) -> None:
    """One fused projection: ``name.original`` with the partitions' rows stacked, and each partition's pair."""
    originals, biases = [], []
    for i, layer in enumerate(layers):
        base = getattr(layer, "base_layer", None)
        if base is None or "default" not in getattr(layer, "lora_A", {}):
            raise ExportError(
                f"{name}: the decoder has no LoRA here; inject training.character_decoder.DECODER_LORA first"
            )
        lora_a, lora_b = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # (r, in), (out, r)
        rank = lora_a.shape[0]
        # SAT applies B @ A / r; peft applies B @ A * scaling: B carries the difference (none for lora_alpha 1).
        state.put(f"{name}.matrix_A.{i}", lora_a)
        state.put(f"{name}.matrix_B.{i}", lora_b * (layer.scaling["default"] * rank))
        originals.append(base.weight)
        biases.append(base.bias)
        state.mark(lora_a, lora_b, base.weight, base.bias)
    state.put(f"{name}.original.weight", torch.cat(originals))
    state.put(f"{name}.original.bias", torch.cat(biases))


def decoder_release_state(decoder: nn.Module) -> dict[str, torch.Tensor]:
    """The ``module`` dict the release's SATVideoDiffusionEngine holds for this decoder's weights."""
    state = NamedState(decoder)
    state.module_(DIT + "mixins.patch_embed.proj.", decoder.patch_embed)
    state.module_(DIT + "time_embed.", decoder.time_embedding, {"linear_1": "0", "linear_2": "2"})
    state.module_(DIT + "flow_embed.", decoder.flow_embedding, {"linear_1": "0", "linear_2": "2"})

    for i, block in enumerate(decoder.transformer_blocks):
        layer = f"{DIT}transformer.layers.{i}."
        state.module_(layer + "input_layernorm.", block.norm1.norm)
        state.module_(layer + "post_attention_layernorm.", block.norm2.norm)
        attn = block.attn1
        _lora(state, layer + "attention.query_key_value", [attn.to_q, attn.to_k, attn.to_v])
        _lora(state, layer + "attention.dense", [attn.to_out[0]])
        state.module_(layer + "mlp.dense_h_to_4h.", block.ff.net[0].proj)
        state.module_(layer + "mlp.dense_4h_to_h.", block.ff.net[2])
        state.module_(f"{DIT}mixins.adaln_layer.query_layernorm_list.{i}.", attn.norm_q)
        state.module_(f"{DIT}mixins.adaln_layer.key_layernorm_list.{i}.", attn.norm_k)
        # The release's adaLN chunk(12) order: video (shift, scale, gate) for attention, then for the MLP, then the
        # same six for the condition tokens; diffusers' LayerNormZero gives video then condition for each norm.
        for kind in ("weight", "bias"):
            attn_video, attn_cond = getattr(block.norm1.linear, kind).chunk(2)
            mlp_video, mlp_cond = getattr(block.norm2.linear, kind).chunk(2)
            fused = torch.cat([attn_video, mlp_video, attn_cond, mlp_cond])
            state.put(f"{DIT}mixins.adaln_layer.adaLN_modulations.{i}.1.{kind}", fused)
        state.mark(*block.norm1.linear.parameters(), *block.norm2.linear.parameters())

    state.module_(DIT + "transformer.final_layernorm.", decoder.norm_final)
    state.module_(DIT + "mixins.final_layer.norm_final.", decoder.norm_out.norm)
    state.module_(DIT + "mixins.final_layer.adaLN_modulation.1.", decoder.norm_out.linear)
    state.module_(DIT + "mixins.final_layer.linear.", decoder.proj_out)
    state.module_(DIT + "mixins.patch_embed.text_proj.", decoder.text_proj)
    state.module_(DIT + "mixins.patch_embed.ip_proj.", decoder.ip_proj)
    state.module_(DIT + "mixins.patch_embed.txt_mix_layer_norm.", decoder.text_norm)
    state.module_(DIT + "mixins.patch_embed.ip_mix_layer_norm.", decoder.ip_norm)
    state.check_complete()
    return state.tensors


def save_release_decoder(
    module_state: dict[str, torch.Tensor], directory: Path, step: int, client_state: dict[str, object] | None = None
) -> Path:
    """``<directory>/<step>/mp_rank_00_model_states.pt``, then ``<directory>/latest``: the step is named only once
    its file is whole, so a stopped export never points ``latest`` at half a file."""
    file = Path(directory) / str(step) / MODEL_STATES
    _save_whole({"module": module_state, "iteration": step, **(client_state or {})}, file)
    latest = Path(directory) / "latest"
    latest.with_name("latest.partial").write_text(str(step))
    latest.with_name("latest.partial").replace(latest)
    return file


def mllm_release_state(mllm: nn.Module) -> dict[str, torch.Tensor]:
    """The release wrapper's state dict for what training changed in ``mllm`` (our AnimeGamerMLLM, with peft's
    LoRA injected into its ``llm``)."""
    state: dict[str, torch.Tensor] = {}
    pairs = 0
    for name, param in mllm.named_parameters():
        head, _, local = name.partition(".")
        if head in ("input_resampler", "output_resampler"):
            state[f"{head}.proj.{local}"] = param
        elif head != "llm":
            raise ExportError(f"{name} has no place in the release's MLLM file")
        elif ".lora_A.default." in local or ".lora_B.default." in local:
            layer = mllm.llm.get_submodule(local.split(".lora_")[0])
            factor = layer.scaling["default"] * layer.r["default"] / RELEASE_MLLM_ALPHA
            state[LLM + local] = param * factor if ".lora_B." in local else param
            pairs += 1
        elif local.endswith("norm.weight"):  # the trained RMSNorm copies
            state[LLM + local.removesuffix("weight") + "modules_to_save.default.weight"] = param
        elif local in EMBEDDINGS:
            state[LLM + local] = param
        # anything else is a frozen base weight: the shared Mistral directory's
    if not pairs:
        raise ExportError("the MLLM has no LoRA; inject training.character_phase_b.MLLM_LORA into its llm first")
    return {key: tensor.detach().to("cpu", copy=True).contiguous() for key, tensor in state.items()}


def _save_whole(value: object, file: Path) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_name(file.name + ".partial")
    torch.save(value, partial)
    os.replace(partial, file)


def export_character(root: Path, name: str, mllm: nn.Module, decoder: nn.Module, step: int) -> CheckpointLayout:
    """Both halves of a trained character under ``root`` in the release's layout; the decoder's ``latest`` last."""
    layout = CheckpointLayout(Path(root), name)
    _save_whole(mllm_release_state(mllm), layout.mllm_file)
    save_release_decoder(decoder_release_state(decoder), layout.decoder_dir, step)
    return layout
