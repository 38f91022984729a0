"""One Mistral base serving every character: each character's trained parts sit beside it.

The published MLLMs of Qiqi and Sosuke share one Mistral-7B base and differ only by what
AnimeGamer trained (MLLM/configs/clm_models/mistral-7b.yaml): a rank-32 LoRA on the seven
projections of every layer, the RMSNorm weights, the embedding and head matrices, and the two
resamplers. That is about 0.7 GiB a character in bf16 against 13 GiB of shared projections, so
a worker holds the base once and switches characters per turn by pointing the module at the
character's tensors: no copy, no reload.

The LoRA stays unmerged and runs as the release's peft layers run it, ``base(x) + s * B(A(x))``
(s = alpha / r), through a forward hook on each projection. ``mode="merged"`` instead folds
``s * B @ A`` into the shared weight on each switch and takes it out again; it is kept for
``benchmarks/character_switch.py``, which measures both (README, "Serving the published model").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from worker.pipeline.mllm import AnimeGamerMLLM

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SwitchMode = Literal["unmerged", "merged"]


def is_character_parameter(name: str) -> bool:
    """Whether an ``AnimeGamerMLLM`` parameter is trained per character (else it is the shared base).

    Everything but the LoRA-adapted projections: norms, embedding and head, resamplers.
    """
    module = name.rpartition(".")[0]
    return module.rpartition(".")[2] not in LORA_TARGETS


def lora_targets(mllm: AnimeGamerMLLM) -> list[str]:
    """Module paths of the projections the release adapts with LoRA, in module order."""
    return [name for name, module in mllm.named_modules() if name.rpartition(".")[2] in LORA_TARGETS]


@dataclass
class CharacterParts:
    """What one character's training changed, as tensors on the MLLM's home device."""

    values: dict[str, nn.Parameter]  # AnimeGamerMLLM parameter name -> this character's tensor
    lora: dict[str, tuple[nn.Parameter, nn.Parameter]]  # projection path -> (A [r, in], B [out, r])
    scale: float  # lora_alpha / r

    def tensors(self) -> list[torch.Tensor]:
        return [*self.values.values(), *(t for pair in self.lora.values() for t in pair)]


def _add_lora(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
    if module.lora_merged:
        return output
    x = args[0]  # [..., in]
    down = F.linear(x, module.lora_A).view(-1, module.lora_A.shape[0])  # [N, r]
    # Added into the projection's fresh output in place (view, never a copy): a second [N, out] is not free.
    output.view(-1, output.shape[-1]).addmm_(down, module.lora_B.t(), alpha=module.lora_scale)  # [N, out]
    return output


class SharedMLLM:
    """The MLLM module plus every character's parts; ``use`` makes one character's the module's own."""

    def __init__(
        self, mllm: AnimeGamerMLLM, characters: Mapping[str, CharacterParts], mode: SwitchMode = "unmerged"
    ) -> None:
        if not characters:
            raise ValueError("a shared MLLM needs at least one character")
        self.mllm = mllm
        self.characters = dict(characters)
        self.mode = mode
        self.active: str | None = None
        self._projections = {path: mllm.get_submodule(path) for path in lora_targets(mllm)}
        self._hooks = []
        for module in self._projections.values():
            module.lora_merged = False
            self._hooks.append(module.register_forward_hook(_add_lora))
        self.use(next(iter(self.characters)))

    def detach(self, character: str) -> tuple[AnimeGamerMLLM, CharacterParts]:
        """The module with ``character``'s parts as its own and the plain base projections (LoRA hooks removed),
        and that character's LoRA: where training a new character starts from a published one. This object
        serves no character afterwards."""
        self.set_mode("unmerged")
        self.use(character)
        parts = self.characters[character]
        for hook in self._hooks:
            hook.remove()
        for module in self._projections.values():
            for name in ("lora_A", "lora_B"):
                del module._parameters[name]
            del module.lora_merged, module.lora_scale
        self.characters, self.active = {}, None
        return self.mllm, parts

    def use(self, character: str) -> AnimeGamerMLLM:
        """Point the module at ``character``'s tensors (and, merged, swap the folded LoRA)."""
        if character == self.active:
            return self.mllm
        parts = self.characters[character]  # KeyError: a worker only routes its own characters here
        if self.mode == "merged" and self.active is not None:
            self._fold(self.characters[self.active], sign=-1.0)
        for name, tensor in parts.values.items():
            path, _, leaf = name.rpartition(".")
            self.mllm.get_submodule(path).register_parameter(leaf, tensor)
        for path, (lora_a, lora_b) in parts.lora.items():
            module = self._projections[path]
            module.register_parameter("lora_A", lora_a)
            module.register_parameter("lora_B", lora_b)
            module.lora_scale = parts.scale
        if self.mode == "merged":
            self._fold(parts, sign=1.0)
        self.active = character
        return self.mllm

    def set_mode(self, mode: SwitchMode) -> None:
        """Fold the active character's LoRA in (``merged``) or out (``unmerged``) of the shared weights."""
        if mode != self.mode and self.active is not None:
            self._fold(self.characters[self.active], sign=1.0 if mode == "merged" else -1.0)
        self.mode = mode

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor this object holds: the module's own and each character's, each once."""
        found: dict[int, torch.Tensor] = {id(t): t for t in self.mllm.parameters()}
        for parts in self.characters.values():
            found.update((id(t), t) for t in parts.tensors())
        return list(found.values())

    @torch.no_grad()
    def _fold(self, parts: CharacterParts, sign: float) -> None:
        for path, (lora_a, lora_b) in parts.lora.items():
            weight = self._projections[path].weight  # [out, in]
            delta = lora_b.float() @ lora_a.float()  # [out, in], in float32, then rounded once into the weight
            weight.copy_((weight.float() + sign * parts.scale * delta).to(weight.dtype))
            self._projections[path].lora_merged = sign > 0


def random_parts(mllm: AnimeGamerMLLM, seed: int, rank: int = 32) -> CharacterParts:
    """A character's parts with seeded random values at ``mllm``'s sizes: random weights, for benchmarks."""
    generator = torch.Generator().manual_seed(seed)

    def like(shape: tuple[int, ...]) -> nn.Parameter:
        value = torch.randn(shape, generator=generator) * 0.02
        return nn.Parameter(value.to(mllm.device, mllm.dtype), requires_grad=False)

    values = {name: like(tuple(p.shape)) for name, p in mllm.named_parameters() if is_character_parameter(name)}
    lora = {}
    for path in lora_targets(mllm):
        linear = mllm.get_submodule(path)
        lora[path] = (like((rank, linear.in_features)), like((linear.out_features, rank)))
    return CharacterParts(values, lora, scale=1.0)
