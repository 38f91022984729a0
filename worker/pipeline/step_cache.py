"""Reusing the decoder's work across denoising steps where its input barely changed (first-block caching).

Consecutive steps of the sampler feed the transformer nearly the same input at many steps, and then its blocks
add nearly the same residual. First-block caching (ParaAttention's FBCache; TeaCache is the same idea measured on
the modulated input) runs the first block at every step and compares the residual it adds with the one it added at
the last step that ran every block: when the relative change is below a threshold, the other blocks' residual from
that step is added instead of running them. The first block is 1/30 of the published decoder's work, so a reused
step costs about 3% of a full one.

It pays where the sampler's steps are quiet, as with ODE samplers. This project's sampler is the release's
DPM-Solver++(2M) SDE, which adds fresh noise at every step: measured on the toy model, the first block's residual
moves by 0.18-0.25 at every step but the first few, so a threshold either reuses nothing (0.15) or reuses steps
that did change (0.2: a fifth of them, a turn 11% quicker, frames 67 dB from the full-compute ones; 0.25: 44%,
and frames down to 28 dB).
It is therefore off unless ``ANIMEGAMER_STEP_CACHE_BELOW`` is set (benchmarks/compute_cuts.py).

One cache lives for one turn's denoising loop. A step whose batch differs from the cached one (the CFG pair
against the conditional half alone) always runs every block and becomes the cached step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepCache:
    threshold: float  # relative mean absolute change of the first block's residual below which a step is reused
    first_residual: torch.Tensor | None = None  # (B, N, D): the first block's residual at the last computed step
    rest_video: torch.Tensor | None = None  # (B, N, D): what the other blocks added to the video tokens then
    rest_condition: torch.Tensor | None = None  # (B, 226, D): and to the condition tokens
    computed: int = 0
    reused: int = 0

    def reusable(self, first_residual: torch.Tensor) -> bool:
        """Whether this step's first-block residual is close enough to the cached step's to reuse the rest."""
        previous = self.first_residual
        if previous is None or previous.shape != first_residual.shape:
            return False
        change = (first_residual - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)
        return bool(change < self.threshold)

    def store(self, first_residual: torch.Tensor, rest_video: torch.Tensor, rest_condition: torch.Tensor) -> None:
        self.first_residual, self.rest_video, self.rest_condition = first_residual, rest_video, rest_condition
        self.computed += 1
