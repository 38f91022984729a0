"""The published sizes, checked on the meta device (no memory, no weights): parameters and bytes."""

from __future__ import annotations

import pytest
import torch

from worker.pipeline.config import full
from worker.pipeline.memory import ACTIVATION_GIB, GIB, plan


def full_plan():
    return plan(full(), mllm_dtype=torch.bfloat16, decoder_dtype=torch.bfloat16)


def test_the_full_mllm_is_mistral_7b_with_the_animegamer_vocabulary_and_two_resamplers():
    resamplers = (1920 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 1920 + 1920) + (1920 * 1920 + 1920)
    assert 7.240e9 < full_plan().mllm_params - resamplers < 7.248e9


def test_the_full_decoder_is_cogvideox_2b_sized():
    assert 1.69e9 < full_plan().decoder_params < 1.72e9


def test_the_full_vae_is_the_cogvideox_3d_vae():
    assert 0.21e9 < full_plan().vae_params < 0.22e9


def test_bf16_weights_take_two_bytes_a_parameter():
    p = full_plan()
    assert (p.mllm_bytes, p.decoder_bytes, p.vae_bytes) == (2 * p.mllm_params, 2 * p.decoder_params, 2 * p.vae_params)


def test_resident_weights_take_17_gib_and_offloading_the_mllm_leaves_the_largest_part_alone():
    p = full_plan()
    resident = p.gpu_bytes(offload_mllm=False) / GIB - ACTIVATION_GIB
    offloaded = p.gpu_bytes(offload_mllm=True) / GIB - ACTIVATION_GIB
    assert 17.0 < resident < 17.3  # 13.6 GiB MLLM + 3.2 GiB decoder + 0.4 GiB VAE, all bf16
    assert offloaded == p.mllm_bytes / GIB  # the MLLM alone, then the decoder alone


def test_the_full_model_stays_resident_on_an_h200_is_offloaded_on_a_24_gb_card_and_refused_on_8():
    from worker.pipeline.checkpoints.load import offload_decision
    from worker.pipeline.pipeline import PipelineLoadError

    p = full_plan()
    assert offload_decision(p, 139 * GIB, "animegamer") is False
    assert offload_decision(p, 22 * GIB, "animegamer") is True  # 24 GB is 22.4 GiB
    with pytest.raises(PipelineLoadError, match=r"8\.0 GiB free.*ANIMEGAMER_OFFLOAD_MLLM=on"):
        offload_decision(p, 8 * GIB, "animegamer")
