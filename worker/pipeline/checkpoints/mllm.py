"""Loading the release's MLLM: the Mistral base directory plus the AnimeGamer wrapper's state dict.

The release builds ``ContinuousLVLM_Video(llm, input_resampler, output_resampler)``
[MLLM/src/models_clm/models.py] around ``get_peft_model(MistralForCausalLM, LoraConfig(...))``
[MLLM/src/models_clm/peft_models.py, MLLM/configs/clm_models/mistral-7b.yaml] and loads
``pytorch_model.bin`` into the whole wrapper with ``load_state_dict(strict=False)``. The file's key
names therefore follow that module tree (checked against peft's own ``state_dict``):

    llm.base_model.model.                          PeftModelForCausalLM -> LoraModel -> MistralForCausalLM
        model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.default.weight     LoRA pairs, A [r, in], B [out, r]
        model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.default.weight
        model.layers.{i}.{input,post_attention}_layernorm.modules_to_save.default.weight   trained norm copies
        model.norm.modules_to_save.default.weight
        model.embed_tokens.weight, lm_head.weight  trained in full, plain (not modules_to_save), resized rows
    input_resampler.proj.{0,2}.{weight,bias}       ProjectionLayer.proj = Linear, GELU, Linear
    output_resampler.proj.{0,2}.{weight,bias}      [MLLM/src/models/discrete_models.py]

Here the LoRA pairs are merged into the base weights (W += alpha / r * B @ A; alpha = r = 32 in the
release, so the scale is 1) and the result is an ordinary ``AnimeGamerMLLM``: no peft at inference.
Merging in float32 then casting differs from the release's unmerged bf16 forward only by rounding.

Skip rule: file tensors that inference never reads are dropped by pattern, and only these.

- ``*.original_module.*``: peft keeps the frozen pre-training copy of every ``modules_to_save``
  module beside the trained one; the forward pass runs only the adapter's copy (``default``).
- ``*rotary_emb.{inv_freq,cos_cached,sin_cached}``: rotary tables derived from ``rope_theta`` and the
  head size, rebuilt here (older transformers versions saved them in state dicts).
- ``pos_embed_spatial``, ``pos_embed_temporal``, ``pos_embed_decoder``, ``decoder_blocks.*``: wrapper
  parts that the release's config switches off (``query_pos: False``, ``transformer_decode`` default
  False), so its module has no such attributes and ``strict=False`` drops them too.

Frozen base copies in a full state dict (``*_proj.base_layer.weight``, or ``*_proj.weight`` before
peft 0.7) are not skipped: ``strict=False`` would load them over the base, so they are used, in place
of the Hugging Face directory's. Anything else unexpected, missing or misshapen is a ``CheckpointError``.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from worker.pipeline.characters import LORA_TARGETS, CharacterParts, SharedMLLM, is_character_parameter
from worker.pipeline.checkpoints.errors import CheckpointError
from worker.pipeline.checkpoints.files import RELEASE_EVERY, hand_back, load_torch_file, trim_heap
from worker.pipeline.config import MLLMConfig
from worker.pipeline.mllm import AnimeGamerMLLM

logger = logging.getLogger(__name__)

LLM_PREFIX = "llm.base_model.model."  # PeftModelForCausalLM.base_model (LoraModel).model (MistralForCausalLM)
ADAPTER = "default"  # peft's name for the only adapter the release trains
NORMS = ("input_layernorm", "post_attention_layernorm", "norm")  # modules_to_save
LORA_RANK = 32  # mistral-7b.yaml; the rank actually merged is read from the file's A matrices
LORA_ALPHA = 32.0  # mistral-7b.yaml; not stored in the state dict, so it is a constant here
RESAMPLERS = ("input_resampler", "output_resampler")

SKIP_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\.original_module\."), "peft's frozen copy of a modules_to_save module"),
    (re.compile(r"(^|\.)rotary_emb\.(inv_freq|cos_cached|sin_cached)$"), "rotary tables, rebuilt from rope_theta"),
    (
        re.compile(r"^(pos_embed_spatial|pos_embed_temporal|pos_embed_decoder)$|^decoder_blocks\."),
        "wrapper parts the release's config switches off",
    ),
)

_MAX_LISTED = 5  # keys named in one error message
_Role = Literal["value", "lora_A", "lora_B", "base"]


def skip_reason(key: str) -> str | None:
    """Why ``key`` is never read at inference, or None when it must be used (see the module docstring)."""
    for pattern, reason in SKIP_RULES:
        if pattern.search(key):
            return reason
    return None


# --- config.json -------------------------------------------------------------------------------------------


def mllm_config_from_dir(mistral_dir: Path | str) -> MLLMConfig:
    """The LLM's sizes from ``<mistral_dir>/config.json`` (a Hugging Face Mistral config).

    Read rather than assumed so that a wrong or partial download fails here, naming the field,
    instead of as a shape error deep in the load.
    """
    path = Path(mistral_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(path, "missing", "the Hugging Face config.json of Mistral-7B-Instruct-v0.1")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"unreadable ({exc})", "a JSON object") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(path, f"holds a {type(raw).__name__}", "a JSON object")

    def field(name: str, kind: type, value: Any = None) -> Any:
        value = raw.get(name) if value is None else value
        if value is None:
            raise CheckpointError(path, f"has no {name!r}", f"a positive {kind.__name__}")
        # bool is an int subclass, so it is refused by name; an int is a fine float.
        if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)) or value <= 0:
            raise CheckpointError(path, f"{name!r} is {value!r}", f"a positive {kind.__name__}")
        return kind(value)

    model_type = raw.get("model_type", "mistral")
    if model_type != "mistral":
        raise CheckpointError(path, f"model_type is {model_type!r}", "'mistral'")
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(path, f"hidden_act is {raw['hidden_act']!r}", "'silu'")
    if raw.get("tie_word_embeddings", False):
        raise CheckpointError(path, "tie_word_embeddings is true", "separate input and output embeddings")
    if raw.get("rope_scaling") is not None:
        raise CheckpointError(path, f"rope_scaling is {raw['rope_scaling']!r}", "none (plain RoPE)")
    # transformers 5 writes rope_theta inside rope_parameters; Mistral's own file has it at the top.
    rope_parameters = raw.get("rope_parameters")
    rope_theta = raw.get("rope_theta")
    if rope_theta is None and isinstance(rope_parameters, dict):
        rope_theta = rope_parameters.get("rope_theta")

    config = MLLMConfig(
        base_vocab_size=field("vocab_size", int),
        hidden_size=field("hidden_size", int),
        num_layers=field("num_hidden_layers", int),
        num_heads=field("num_attention_heads", int),
        num_kv_heads=field("num_key_value_heads", int),
        intermediate_size=field("intermediate_size", int),
        max_position_embeddings=field("max_position_embeddings", int),
        rope_theta=field("rope_theta", float, rope_theta),
        rms_norm_eps=field("rms_norm_eps", float),
    )
    if config.hidden_size % config.num_heads or config.num_heads % config.num_kv_heads:
        raise CheckpointError(
            path,
            f"hidden_size {config.hidden_size}, {config.num_heads} heads, {config.num_kv_heads} KV heads",
            "hidden_size a multiple of the heads and the heads a multiple of the KV heads",
        )
    head_dim = raw.get("head_dim")
    if head_dim is not None and head_dim != config.hidden_size // config.num_heads:
        expected = f"hidden_size / heads = {config.hidden_size // config.num_heads}"
        raise CheckpointError(path, f"head_dim is {head_dim!r}", expected)
    return config


# --- tensor files ------------------------------------------------------------------------------------------


class _Tensors:
    """Named tensors spread over checkpoint files: shapes known up front, values read on demand.

    Keeps a 15 GB base directory out of memory until each tensor is needed, and ties every
    tensor to the file it came from so errors can name that file.
    """

    def __init__(self) -> None:
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.files: dict[str, Path] = {}
        self._readers: dict[Path, Callable[[str], torch.Tensor]] = {}
        self._read = 0  # bytes read since memory was last handed back

    def add(self, path: Path, shapes: Mapping[str, tuple[int, ...]], read: Callable[[str], torch.Tensor]) -> None:
        for key, shape in shapes.items():
            if key in self.files:
                raise CheckpointError(path, f"repeats tensor {key}", f"it in one file only, not also {self.files[key]}")
            self.shapes[key] = shape
            self.files[key] = path
        self._readers[path] = read

    def get(self, key: str) -> torch.Tensor:
        path = self.files[key]
        try:
            tensor = self._readers[path](key)
        except Exception as exc:  # a damaged file fails here in library-specific ways; all mean the same
            raise CheckpointError(path, f"cannot read tensor {key} ({exc})", "an intact file") from exc
        self._read += tensor.nbytes
        if self._read >= RELEASE_EVERY:  # the reader knows how far the load has got: free what it is done with
            trim_heap()
            self._read = 0
        return tensor

    def add_safetensors(self, path: Path) -> None:
        from safetensors import safe_open

        if not path.is_file():
            raise CheckpointError(path, "missing", "a safetensors weight file")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
        except Exception as exc:  # safetensors raises its own error type for a bad header or a short file
            raise CheckpointError(path, f"unreadable ({exc})", "a complete safetensors file") from exc

        def read(key: str) -> torch.Tensor:
            # A mapping per tensor, gone with the tensor: one handle per file would keep every page read so far
            # resident until the whole load ends (14 GB of Mistral shards beside the weights built from them).
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                return handle.get_tensor(key)

        self.add(path, shapes, read)

    def add_torch(self, path: Path) -> None:
        state = load_torch_state(path)
        self.add(path, {key: tuple(t.shape) for key, t in state.items()}, state.__getitem__)


def load_torch_state(path: Path) -> dict[str, torch.Tensor]:
    """A flat ``{name: tensor}`` torch file (see ``files.load_torch_file`` for how it is read)."""
    state = load_torch_file(path)
    if not all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state.items()):
        raise CheckpointError(path, "holds something other than a flat state dict", "{name: tensor}")
    return dict(state)


def _open_base_weights(mistral_dir: Path) -> tuple[_Tensors, Path]:
    """The base weights of a Hugging Face directory, and the path errors about them should name."""
    tensors = _Tensors()
    for index_name, single_name, add in (
        ("model.safetensors.index.json", "model.safetensors", tensors.add_safetensors),
        ("pytorch_model.bin.index.json", "pytorch_model.bin", tensors.add_torch),
    ):
        index = mistral_dir / index_name
        if index.is_file():
            weight_map = _read_weight_map(index)
            for shard in sorted(set(weight_map.values())):
                add(mistral_dir / shard)
            for key, shard in weight_map.items():
                if tensors.files.get(key) != mistral_dir / shard:
                    raise CheckpointError(mistral_dir / shard, f"lacks tensor {key}", f"it, as {index} says")
            return tensors, index
        single = mistral_dir / single_name
        if single.is_file():
            add(single)
            return tensors, single
    raise CheckpointError(
        mistral_dir,
        "holds no weights",
        "model.safetensors, model.safetensors.index.json with its shards, or pytorch_model.bin(.index.json)",
    )


def _read_weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(index, f"unreadable ({exc})", 'a JSON object with a "weight_map"') from exc
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and "/" not in v for v in weight_map.values()):
        raise CheckpointError(index, "has a malformed weight_map", "{tensor name: shard file name}")
    return weight_map


# --- the MLLM file's layout --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    """Where one release key goes: the ``AnimeGamerMLLM`` state-dict key it feeds, and how."""

    target: str
    role: _Role
    required: bool


def release_slots(target_keys: Iterable[str]) -> dict[str, _Slot]:
    """Every key the release's wrapper can hold, derived from this module's own state-dict keys."""
    slots: dict[str, _Slot] = {}
    for key in target_keys:
        head, _, rest = key.partition(".")
        module, _, leaf = rest.rpartition(".")
        last = module.rpartition(".")[2]
        if head in RESAMPLERS:  # nn.Sequential here, ProjectionLayer.proj there
            slots[f"{head}.proj.{rest}"] = _Slot(key, "value", True)
        elif head != "llm":
            raise AssertionError(f"AnimeGamerMLLM has a parameter {key} the release layout does not know")
        elif last in LORA_TARGETS:
            slots[f"{LLM_PREFIX}{module}.lora_A.{ADAPTER}.{leaf}"] = _Slot(key, "lora_A", True)
            slots[f"{LLM_PREFIX}{module}.lora_B.{ADAPTER}.{leaf}"] = _Slot(key, "lora_B", True)
            slots[f"{LLM_PREFIX}{module}.base_layer.{leaf}"] = _Slot(key, "base", False)  # peft >= 0.7
            slots[f"{LLM_PREFIX}{rest}"] = _Slot(key, "base", False)  # older peft: the LoRA layer was the Linear
        elif last in NORMS:
            slots[f"{LLM_PREFIX}{module}.modules_to_save.{ADAPTER}.{leaf}"] = _Slot(key, "value", True)
        elif rest in ("model.embed_tokens.weight", "lm_head.weight"):
            slots[f"{LLM_PREFIX}{rest}"] = _Slot(key, "value", True)
        else:
            raise AssertionError(f"AnimeGamerMLLM has a parameter {key} the release layout does not know")
    return slots


def _expected_shape(slot: _Slot, target: tuple[int, ...], rank: int) -> tuple[int, ...]:
    if slot.role == "lora_A":
        return (rank, target[1])  # [r, in]
    if slot.role == "lora_B":
        return (target[0], rank)  # [out, r]
    return target


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
    return ", ".join(items[:_MAX_LISTED]) + more


# --- loading -----------------------------------------------------------------------------------------------


def load_mllm(
    mistral_dir: Path | str,
    mllm_file: Path | str,
    *,
    vocab_size: int,
    representation_dim: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    validate_only: bool = False,
) -> AnimeGamerMLLM | None:
    """The release's MLLM with its LoRA merged: Mistral base directory + the wrapper's ``pytorch_model.bin``.

    Everything is checked before any weight is read: every key of the file is used, skipped by
    ``SKIP_RULES`` or reported, every required key is present and every shape matches. The module
    is built on the meta device and filled in one ``load_state_dict(assign=True)`` at the end, so
    a failure never leaves a half-loaded model behind (and 7B parameters are never initialised).

    Args:
        mistral_dir: the Hugging Face Mistral-7B-Instruct-v0.1 directory (config.json and weights).
        mllm_file: ``AnimeGamer/MLLM-<Character>/pytorch_model.bin``.
        vocab_size: the tokenizer's size, base vocabulary plus the 284 AnimeGamer tokens (32,284).
        representation_dim: the decoder's hidden size (1920), the resamplers' outer width.
        dtype: the parameters' dtype; the release runs the MLLM in bf16.
        device: where the parameters live; LoRA is merged there, in float32.
        validate_only: check every key and shape of both sources, read no weight, return None
            (``animegamer checkpoints check``).
    """
    mistral_dir, mllm_file, device = Path(mistral_dir), Path(mllm_file), torch.device(device)

    # 1. Sizes, and an empty module at those sizes
    config, module, targets = _empty_module(mistral_dir, vocab_size, representation_dim)

    # 2. Check the MLLM file against the release layout, then the base directory
    slots = release_slots(targets)
    state, rank, overrides, skipped = _checked_mllm_file(mllm_file, slots, targets)
    base = _checked_base(mistral_dir, config, targets)

    if validate_only:
        return None

    # 4. Assemble: merged projections, trained norms / embeddings / resamplers from the MLLM file
    scale = LORA_ALPHA / rank
    pairs: dict[str, dict[_Role, torch.Tensor]] = {}
    weights: dict[str, torch.Tensor] = {}
    for key, slot in slots.items():
        if slot.role == "value":
            weights[slot.target] = state[key].to(device=device, dtype=dtype, copy=True)  # copy: off the file's mmap
        elif slot.role in ("lora_A", "lora_B"):
            pairs.setdefault(slot.target, {})[slot.role] = state[key]
    hand_back(mllm_file)  # the embeddings' and resamplers' pages, copied: 0.5 GB of the file at full size
    for target, pair in pairs.items():
        source = state[overrides[target]] if target in overrides else base.get(target.removeprefix("llm."))
        merged = source.to(device=device, dtype=torch.float32, copy=True)  # merge in float32, cast once
        lora_b = pair["lora_B"].to(device=device, dtype=torch.float32)
        lora_a = pair["lora_A"].to(device=device, dtype=torch.float32)
        merged.addmm_(lora_b, lora_a, alpha=scale)  # W + scale * B @ A
        weights[target] = merged.to(dtype)
    del state  # drops the file's memory map

    # 5. Fill the module in one step
    _fill(module, weights, device)
    logger.info(
        "loaded the MLLM from %s and %s: %d LoRA pairs merged (rank %d, scale %g), %d base copies from the file, "
        "skipped %s",
        mistral_dir,
        mllm_file,
        len(pairs),
        rank,
        scale,
        len(overrides),
        dict(skipped) or "nothing",
    )
    return module


def load_shared_mllm(
    mistral_dir: Path | str,
    mllm_files: Mapping[str, Path],
    *,
    vocab_size: int,
    representation_dim: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> SharedMLLM:
    """One Mistral base and each character's trained parts beside it, the LoRA left unmerged.

    Every file gets the checks of ``load_mllm``. A character file that carries frozen base copies
    must carry the base the others share: a different one is refused, since the characters could
    then not share it (serve such a character in a worker of its own).

    Args:
        mllm_files: ``{character: AnimeGamer/MLLM-<Character>/pytorch_model.bin}``.
        device: where the base and every character's parts live (the MLLM's home).
    """
    mistral_dir, device = Path(mistral_dir), torch.device(device)
    config, module, targets = _empty_module(mistral_dir, vocab_size, representation_dim)
    slots = release_slots(targets)
    checked = {name: _checked_mllm_file(Path(path), slots, targets) for name, path in mllm_files.items()}
    base = _checked_base(mistral_dir, config, targets)

    # 1. The shared projections, read once from the base directory
    weights = {
        target: base.get(target.removeprefix("llm.")).to(device=device, dtype=dtype, copy=True)
        for target in targets
        if not is_character_parameter(target)
    }

    # 2. Each character's parts: its trained values and its LoRA factors, as the file holds them
    characters: dict[str, CharacterParts] = {}
    for name, (state, rank, overrides, _) in checked.items():
        for target, key in overrides.items():
            if not torch.equal(state[key].to(dtype), weights[target].cpu()):
                raise CheckpointError(
                    Path(mllm_files[name]), f"holds base weights ({key}) unlike {mistral_dir}'s", "the shared base"
                )
        values: dict[str, nn.Parameter] = {}
        factors: dict[str, dict[_Role, nn.Parameter]] = {}
        for key, slot in slots.items():
            if slot.role == "value":
                values[slot.target] = _parameter(state[key], device, dtype)
            elif slot.role in ("lora_A", "lora_B"):
                factors.setdefault(slot.target.removesuffix(".weight"), {})[slot.role] = _parameter(
                    state[key], device, dtype
                )
        lora = {path: (pair["lora_A"], pair["lora_B"]) for path, pair in factors.items()}
        characters[name] = CharacterParts(values=values, lora=lora, scale=LORA_ALPHA / rank)
        hand_back(mllm_files[name])  # ``checked`` keeps every file mapped until the end: its read pages go now

    # 3. Fill the module with the first character's values; SharedMLLM switches them per turn
    first = next(iter(characters.values()))
    _fill(module, {**weights, **first.values}, device)
    logger.info("loaded one MLLM base from %s for %s, LoRA unmerged", mistral_dir, ", ".join(characters))
    return SharedMLLM(module, characters)


def _parameter(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(tensor.to(device=device, dtype=dtype, copy=True), requires_grad=False)  # off the mmap


def _empty_module(
    mistral_dir: Path, vocab_size: int, representation_dim: int
) -> tuple[MLLMConfig, AnimeGamerMLLM, dict[str, tuple[int, ...]]]:
    """config.json's sizes, the module at those sizes on the meta device, and its state dict's shapes."""
    config = mllm_config_from_dir(mistral_dir)
    if vocab_size <= config.base_vocab_size:
        raise CheckpointError(
            mistral_dir / "config.json",
            f"vocab_size {config.base_vocab_size} is not below the tokenizer's {vocab_size}",
            "the base vocabulary the 284 AnimeGamer tokens extend",
        )
    with torch.device("meta"):
        module = AnimeGamerMLLM(config, vocab_size, representation_dim)
    return config, module, {key: tuple(t.shape) for key, t in module.state_dict().items()}


def _fill(module: AnimeGamerMLLM, weights: dict[str, torch.Tensor], device: torch.device) -> None:
    """Fill the meta module in one step, and rebuild the rotary tables the meta device left empty."""
    module.load_state_dict(weights, strict=True, assign=True)
    rotary = module.llm.model.rotary_emb
    module.llm.model.rotary_emb = type(rotary)(config=module.llm.config).to(device)  # on the CPU, as from_pretrained
    empty = [name for name, t in chain(module.named_parameters(), module.named_buffers()) if t.is_meta]
    assert not empty, f"tensors left unloaded on the meta device: {empty}"
    module.eval().requires_grad_(False)


def _checked_mllm_file(
    mllm_file: Path, slots: dict[str, _Slot], targets: dict[str, tuple[int, ...]]
) -> tuple[dict[str, torch.Tensor], int, dict[str, str], Counter[str]]:
    """The MLLM file's tensors (memory-mapped), its LoRA rank, its frozen base copies and what was skipped.

    Every key is used, skipped by rule or reported; every required key is there with its shape.
    """
    state = load_torch_state(mllm_file)
    ranks = [state[key].shape[0] for key, slot in slots.items() if slot.role == "lora_A" and key in state]
    rank = ranks[0] if ranks else LORA_RANK
    skipped = Counter(reason for key in state if key not in slots and (reason := skip_reason(key)))
    unexpected = [key for key in state if key not in slots and skip_reason(key) is None]
    if unexpected:
        raise CheckpointError(
            mllm_file, f"unexpected tensor(s) {_listed(unexpected)}", "only the release wrapper's keys (see SKIP_RULES)"
        )
    missing = [
        f"{key} {list(_expected_shape(slot, targets[slot.target], rank))}"
        for key, slot in slots.items()
        if slot.required and key not in state
    ]
    if missing:
        raise CheckpointError(mllm_file, f"missing tensor(s) {_listed(missing)}", "each with the shape given")
    misshapen = [
        f"{key} has shape {list(state[key].shape)}, expected {list(expected)}"
        for key, slot in slots.items()
        if key in state and tuple(state[key].shape) != (expected := _expected_shape(slot, targets[slot.target], rank))
    ]
    if misshapen:
        raise CheckpointError(mllm_file, f"wrong shape: {_listed(misshapen)}", "the shapes of the release's MLLM")
    overrides: dict[str, str] = {}  # target -> file key of a frozen base copy
    for key, slot in slots.items():
        if slot.role == "base" and key in state:
            if slot.target in overrides:
                raise CheckpointError(
                    mllm_file, f"holds both {overrides[slot.target]} and {key}", "one base copy per projection"
                )
            overrides[slot.target] = key
    return state, rank, overrides, skipped


def _checked_base(mistral_dir: Path, config: MLLMConfig, targets: dict[str, tuple[int, ...]]) -> _Tensors:
    """The base directory's tensors (read on demand): every tensor of the Hugging Face model, at config.json's sizes."""
    base, base_path = _open_base_weights(mistral_dir)
    base_vocab = (config.base_vocab_size, config.hidden_size)
    base_targets = {
        key.removeprefix("llm."): (base_vocab if key.endswith(("embed_tokens.weight", "lm_head.weight")) else shape)
        for key, shape in targets.items()
        if key.startswith("llm.")
    }
    unexpected = [key for key in base.shapes if key not in base_targets and skip_reason(key) is None]
    if unexpected:
        raise CheckpointError(base_path, f"unexpected tensor(s) {_listed(unexpected)}", "a Mistral checkpoint's keys")
    missing = [f"{key} {list(shape)}" for key, shape in base_targets.items() if key not in base.shapes]
    if missing:
        raise CheckpointError(base_path, f"missing tensor(s) {_listed(missing)}", "each with the shape given")
    for key, shape in base_targets.items():
        if base.shapes[key] != shape:
            raise CheckpointError(
                base.files[key], f"tensor {key} has shape {list(base.shapes[key])}", f"{list(shape)} (config.json)"
            )
    return base
