"""Write an MLLM with known weights as the release's files, for the loader's tests.

The release's ``pytorch_model.bin`` is the state dict of its wrapper around a peft-wrapped Mistral.
Rather than spelling its key names out (and so repeating whatever the loader assumes), this builds
that structure with transformers and peft themselves, as the release does, and saves its
``state_dict``: the names in the file are peft's own.

Each LoRA pair is random and the base weights are chosen so that base + alpha / r * B @ A equals
the known weight; the base norms and embedding rows differ from the trained ones, so a loader that
takes the wrong copy (``original_module``, the Hugging Face rows) fails the comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from worker.pipeline.checkpoints.layout import CheckpointLayout
from worker.pipeline.mllm import AnimeGamerMLLM

TARGET_MODULES = ["q_proj", "v_proj", "k_proj", "o_proj", "gate_proj", "down_proj", "up_proj"]  # mistral-7b.yaml
MODULES_TO_SAVE = ["input_layernorm", "post_attention_layernorm", "norm"]
# Tensors of the kinds the loader's skip rule drops, as other transformers versions or wrapper settings write them.
SKIPPABLE_EXTRAS = (
    "llm.base_model.model.model.layers.0.self_attn.rotary_emb.inv_freq",
    "pos_embed_spatial",
    "pos_embed_temporal",
)


@dataclass(frozen=True)
class ReleaseFiles:
    layout: CheckpointLayout

    @property
    def mistral_dir(self) -> Path:
        return self.layout.mistral_dir

    @property
    def mllm_file(self) -> Path:
        return self.layout.mllm_file


class _ProjectionLayer(nn.Module):
    """The release's resampler module shape: its layers sit under ``proj``."""

    def __init__(self, source: nn.Sequential) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(1, 1), nn.GELU(), nn.Linear(1, 1))
        self.proj[0], self.proj[2] = _copy_linear(source[0]), _copy_linear(source[2])


class _Wrapper(nn.Module):
    """The release's ``ContinuousLVLM_Video`` as far as its state dict goes: three attributes."""

    def __init__(self, llm: nn.Module, input_resampler: nn.Module, output_resampler: nn.Module) -> None:
        super().__init__()
        self.llm = llm
        self.input_resampler = input_resampler
        self.output_resampler = output_resampler


def _copy_linear(source: nn.Module) -> nn.Linear:
    assert isinstance(source, nn.Linear)
    linear = nn.Linear(source.in_features, source.out_features)
    linear.load_state_dict(source.state_dict())
    return linear


def hf_config_json(known: AnimeGamerMLLM) -> dict[str, object]:
    """config.json as Mistral-7B-Instruct-v0.1 ships it, at the known module's sizes."""
    cfg = known.config
    return {
        "architectures": ["MistralForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "model_type": "mistral",
        "num_attention_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "num_key_value_heads": cfg.num_kv_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0",
        "use_cache": True,
        "vocab_size": cfg.base_vocab_size,
    }


@torch.no_grad()
def write_release_mllm(
    known: AnimeGamerMLLM,
    root: Path,
    *,
    character: str = "Qiqi",
    rank: int = 32,
    lora_alpha: int = 32,
    shards: int = 1,
    trainable_only: bool = False,
    seed: int = 0,
    write_base: bool = True,
) -> ReleaseFiles:
    """Write ``known`` as a Mistral directory (base weights) plus the release's MLLM state dict.

    Args:
        known: the module the files must load back into (float32 weights).
        root: the checkpoint root; files go where ``CheckpointLayout`` expects them.
        rank, lora_alpha: the LoRA config (the release: 32 and 32, scale 1).
        shards: safetensors files in the Mistral directory; more than one adds the index file.
        trainable_only: save only trainable tensors (no ``base_layer`` / ``original_module`` copies),
            as a trainer saving ``requires_grad`` parameters would; else the whole state dict.
        seed: for the LoRA pairs and the base's pre-training norms and embedding rows.
        write_base: False leaves the Mistral directory as another character's writer left it; the file then
            loads into the known module only over the base it was written for (use ``trainable_only``).
    """
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import MistralConfig, MistralForCausalLM

    layout = CheckpointLayout(root, character)
    gen = torch.Generator().manual_seed(seed)
    cfg = known.config
    known_llm = {key: t.detach().float().clone() for key, t in known.llm.state_dict().items()}
    scale = lora_alpha / rank

    # 1. LoRA pairs and the base weights they complete to the known ones
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    base = dict(known_llm)
    for key, weight in known_llm.items():
        if key.rsplit(".", 2)[-2] in TARGET_MODULES:
            out_features, in_features = weight.shape
            lora_a = torch.randn(rank, in_features, generator=gen) / in_features**0.5
            lora_b = torch.randn(out_features, rank, generator=gen) / rank**0.5
            pairs[key.removesuffix(".weight")] = (lora_a, lora_b)
            base[key] = weight - scale * (lora_b @ lora_a)
        elif key.rsplit(".", 2)[-2] in MODULES_TO_SAVE:  # pre-training norms, not the trained copies
            base[key] = 1.0 + 0.1 * torch.randn(weight.shape, generator=gen)
        elif key in ("model.embed_tokens.weight", "lm_head.weight"):  # pre-training rows of the base vocabulary
            rows = weight[: cfg.base_vocab_size]
            base[key] = rows + 0.1 * torch.randn(rows.shape, generator=gen)

    # 2. The Hugging Face directory: config.json and the base weights, optionally sharded with an index
    if write_base:
        layout.mistral_dir.mkdir(parents=True, exist_ok=True)
        (layout.mistral_dir / "config.json").write_text(json.dumps(hf_config_json(known), indent=2))
        keys = list(base)
        if shards == 1:
            save_file({key: base[key].contiguous() for key in keys}, layout.mistral_dir / "model.safetensors")
        else:
            weight_map: dict[str, str] = {}
            for i in range(shards):
                name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
                part = keys[i::shards]
                save_file({key: base[key].contiguous() for key in part}, layout.mistral_dir / name)
                weight_map.update(dict.fromkeys(part, name))
            index = {"metadata": {"total_size": sum(t.numel() * 4 for t in base.values())}, "weight_map": weight_map}
            (layout.mistral_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

    # 3. The release's model: Mistral with the base weights, embeddings resized, then wrapped by peft
    llm_config = MistralConfig(
        vocab_size=cfg.base_vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=False,
    )
    llm = MistralForCausalLM(llm_config)
    llm.load_state_dict(base, strict=True)
    vocab_size = known_llm["model.embed_tokens.weight"].shape[0]
    llm.resize_token_embeddings(vocab_size, mean_resizing=False)
    peft_config = LoraConfig(
        r=rank,
        lora_alpha=lora_alpha,
        lora_dropout=0.05,
        target_modules=TARGET_MODULES,
        modules_to_save=MODULES_TO_SAVE,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(llm, peft_config)
    peft_model.get_input_embeddings().requires_grad_(True)  # as peft_model_animegamer does
    peft_model.get_output_embeddings().requires_grad_(True)

    # 4. The trained values, set through peft's modules (so the names below are peft's, not ours)
    mistral = peft_model.base_model.model
    for name, (lora_a, lora_b) in pairs.items():
        layer = mistral.get_submodule(name)
        layer.lora_A["default"].weight.copy_(lora_a)
        layer.lora_B["default"].weight.copy_(lora_b)
    for name, module in mistral.named_modules():
        if name.rpartition(".")[2] in MODULES_TO_SAVE:
            module.modules_to_save["default"].weight.copy_(known_llm[f"{name}.weight"])
    peft_model.get_input_embeddings().weight.copy_(known_llm["model.embed_tokens.weight"])
    peft_model.get_output_embeddings().weight.copy_(known_llm["lm_head.weight"])
    wrapper = _Wrapper(peft_model, _ProjectionLayer(known.input_resampler), _ProjectionLayer(known.output_resampler))

    # 5. The state dict, as a trainer would save it, plus tensors of the kinds the skip rule drops
    trainable = {name for name, p in wrapper.named_parameters() if p.requires_grad}
    state = {key: t.clone() for key, t in wrapper.state_dict().items() if not trainable_only or key in trainable}
    head_dim = cfg.hidden_size // cfg.num_heads
    state[SKIPPABLE_EXTRAS[0]] = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    state[SKIPPABLE_EXTRAS[1]] = torch.zeros(4, cfg.hidden_size)
    state[SKIPPABLE_EXTRAS[2]] = torch.zeros(1, cfg.hidden_size)
    layout.mllm_file.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, layout.mllm_file)
    return ReleaseFiles(layout)
