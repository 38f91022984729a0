"""How much GPU memory a pipeline needs, from its sizes alone, before any weight is loaded.

Weights are counted exactly (modules built on the ``meta`` device); activations are an
estimate (``ACTIVATION_GIB``) until benchmarks/full_turn_gpu.py has measured the peaks on a GPU.
The point is to refuse early, with the number and the setting that lowers it, instead of failing
with out-of-memory halfway through loading 18 GB.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.pipeline.config import PipelineConfig
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.tokenizer import added_token_names
from worker.pipeline.vae import build_vae

GIB = 2**30
# Not measured yet: the DiT's activations at 6,976 tokens x batch 2 and the chunked VAE decode of
# 17 frames at 480x720. A deliberately generous guess; see the README's "Measured" section.
ACTIVATION_GIB = 6.0


@dataclass(frozen=True)
class MemoryPlan:
    mllm_params: int
    decoder_params: int
    vae_params: int
    mllm_bytes: int
    decoder_bytes: int
    vae_bytes: int

    def gpu_bytes(self, offload_mllm: bool) -> int:
        """Peak GPU bytes: with offloading the MLLM and the decoder are never on the GPU together."""
        weights = self.decoder_bytes + self.vae_bytes
        weights = max(weights, self.mllm_bytes) if offload_mllm else weights + self.mllm_bytes
        return weights + int(ACTIVATION_GIB * GIB)


def plan(config: PipelineConfig, mllm_dtype: torch.dtype, decoder_dtype: torch.dtype) -> MemoryPlan:
    with torch.device("meta"):
        mllm = AnimeGamerMLLM(
            config.mllm,
            config.mllm.base_vocab_size + len(added_token_names()),
            config.decoder.hidden_size,
            num_query_tokens=config.num_query_tokens,
        )
        decoder = AnimeGamerDecoder.from_pipeline_config(config.decoder)
        vae = build_vae(config.vae)
    counts = [sum(p.numel() for p in module.parameters()) for module in (mllm, decoder, vae)]
    m, d, v = counts
    return MemoryPlan(m, d, v, m * mllm_dtype.itemsize, d * decoder_dtype.itemsize, v * decoder_dtype.itemsize)
