"""A module's visit to the GPU, for the stage that needs it.

Weights never change at inference, so the host copy is kept and the GPU copy is simply dropped
when the visit ends: one copy per visit instead of two (``module.to("cuda")`` then
``module.to("cpu")`` would copy everything back too). The module's parameter and buffer slots are
pointed at the GPU copies for the visit and back at the host tensors after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def visiting(module: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """``module`` with every parameter and buffer on ``device`` inside the block, as it was after it."""
    saved: list[tuple[dict, str, torch.Tensor]] = []
    copies: dict[int, torch.Tensor] = {}  # tensor id -> its copy, so shared tensors stay shared
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, tensor in list(table.items()):
                if tensor is None or tensor.device == device:
                    continue
                if id(tensor) not in copies:
                    moved = tensor.to(device, non_blocking=True)
                    is_parameter = isinstance(tensor, nn.Parameter)
                    copies[id(tensor)] = nn.Parameter(moved, requires_grad=False) if is_parameter else moved
                saved.append((table, name, tensor))
                table[name] = copies[id(tensor)]
    try:
        yield module
    finally:
        for table, name, tensor in saved:
            table[name] = tensor
        copies.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
