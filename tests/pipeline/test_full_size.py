"""The published sizes and the GPU memory plan, checked without weights.

Parameter counts come from modules built on the ``meta`` device. The plan is checked against
where the pipeline really puts things: full-size pipelines whose "GPU" is the meta device and
whose host memory is uninitialised CPU storage (never touched, so never resident) go through
the pipeline's own phases, and what sits on the meta device at each stage is summed.
"""

from __future__ import annotations

import pytest
import torch

from worker.pipeline.characters import CharacterParts, SharedMLLM, is_character_parameter, lora_targets
from worker.pipeline.checkpoints.load import assemble
from worker.pipeline.config import full
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.memory import (
    GIB,
    PLACEMENTS,
    STAGES,
    NotEnoughGPUMemory,
    Placement,
    allowed_placements,
    plan,
)
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.pipeline import AnimeGamerPipeline
from worker.pipeline.tokenizer import AnimeGamerTokenizer, ByteBase, added_token_names
from worker.pipeline.vae import build_vae

BF16 = torch.bfloat16
GPU = torch.device("meta")  # stands for the GPU: same shapes and dtypes, no memory
RANK = 32


def full_plan(characters: int = 1, lora_rank: int = 0):
    return plan(full(), BF16, BF16, characters=characters, lora_rank=lora_rank)


def test_the_full_mllm_is_mistral_7b_with_the_animegamer_vocabulary_and_two_resamplers():
    resamplers = (1920 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 1920 + 1920) + (1920 * 1920 + 1920)
    assert 7.240e9 < full_plan().mllm_params - resamplers < 7.248e9


def test_the_full_decoder_is_cogvideox_2b_sized():
    assert 1.69e9 < full_plan().decoder_params < 1.72e9


def test_the_full_vae_is_the_cogvideox_3d_vae():
    assert 0.21e9 < full_plan().vae_params < 0.22e9


def test_a_second_character_adds_its_trained_parts_not_a_second_base():
    """Shared: the 224 adapted projections. Per character: embedding and head (32,284 x 4096 each), 65 norms,
    the resamplers and rank-32 LoRA factors on the 7 projections of 32 layers (Mistral-7B's widths)."""
    p = full_plan(characters=2, lora_rank=RANK)
    projections = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)
    rotary_tables = 2 * 64 * 4  # inv_freq and original_inv_freq, float32
    assert p.mllm_shared_bytes == 2 * projections + rotary_tables
    embeddings = 2 * 32_284 * 4096
    norms = 65 * 4096
    resamplers = (1920 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 1920 + 1920) + (1920 * 1920 + 1920)
    lora = 32 * RANK * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 14336) * 3)
    assert p.mllm_character_bytes == 2 * (embeddings + norms + resamplers + lora)
    assert p.mllm_character_bytes / GIB < 0.75 and 12.9 < p.mllm_shared_bytes / GIB < 13.1


# --- the plan against what the pipeline really leaves on the GPU ----------------------------------------------


def _host(module: torch.nn.Module, offloaded: bool) -> torch.nn.Module:
    """Where the loader puts a part: on the GPU, or in (here uninitialised) host memory when offloaded."""
    return module.to_empty(device="cpu") if offloaded else module


def _characters(mllm: AnimeGamerMLLM, names: list[str], home: torch.device) -> dict[str, CharacterParts]:
    """Each character's parts at full size, shaped as load_shared_mllm builds them."""
    parts = {}
    for name in names:
        values = {
            key: torch.nn.Parameter(torch.empty_like(p, device=home), requires_grad=False)
            for key, p in mllm.named_parameters()
            if is_character_parameter(key)
        }
        lora = {}
        for path in lora_targets(mllm):
            linear = mllm.get_submodule(path)
            a = torch.nn.Parameter(torch.empty(RANK, linear.in_features, dtype=BF16, device=home), requires_grad=False)
            b = torch.nn.Parameter(torch.empty(linear.out_features, RANK, dtype=BF16, device=home), requires_grad=False)
            lora[path] = (a, b)
        parts[name] = CharacterParts(values, lora, scale=1.0)
    return parts


def full_size_pipelines(characters: list[str], placement: Placement) -> list[AnimeGamerPipeline]:
    config = full()
    vocab = config.mllm.base_vocab_size + len(added_token_names())
    with torch.device(GPU):
        torch.set_default_dtype(BF16)
        try:
            mllm = AnimeGamerMLLM(config.mllm, vocab, config.decoder.hidden_size)
            decoders = {c: AnimeGamerDecoder.from_pipeline_config(config.decoder) for c in characters}
            vae = build_vae(config.vae)
        finally:
            torch.set_default_dtype(torch.float32)
    several = len(characters) > 1
    mllm_home = torch.device("cpu") if placement.offload_mllm else GPU
    shared = (
        SharedMLLM(_host(mllm, placement.offload_mllm), _characters(mllm, characters, mllm_home)) if several else None
    )
    if not several:
        _host(mllm, placement.offload_mllm)
    tokenizer = AnimeGamerTokenizer(ByteBase(vocab_size=config.mllm.base_vocab_size))
    decoders = {c: _host(decoders[c], placement.offload_decoder) for c in characters}
    return list(assemble(config, tokenizer, mllm, shared, decoders, vae, GPU, BF16, placement).values())


def bytes_on_gpu(pipelines: list[AnimeGamerPipeline]) -> int:
    """Every tensor any pipeline can reach, each once, that sits on the GPU right now."""
    tensors: dict[int, torch.Tensor] = {}
    for pipe in pipelines:
        for module in (pipe.mllm, pipe.decoder, pipe.vae):
            tensors.update((id(t), t) for t in (*module.parameters(), *module.buffers()))
        if pipe.shared is not None:
            tensors.update((id(t), t) for t in pipe.shared.tensors())
    return sum(t.numel() * t.element_size() for t in tensors.values() if t.device == GPU)


def stages_of_a_turn(pipe: AnimeGamerPipeline, measure) -> dict[str, int]:
    """The phases in the order ``AnimeGamerPipeline.__call__`` enters them."""
    seen = {}
    with pipe.mllm_phase():
        seen["state_pass"] = measure()
        seen["representation_pass"] = measure()
    with pipe.decoder_phase():
        seen["denoise"] = measure()
    seen["vae"] = measure()
    return seen


@pytest.mark.parametrize("placement", PLACEMENTS, ids=lambda p: p.describe())
@pytest.mark.parametrize("characters", [["Qiqi"], ["Qiqi", "Sosuke"]], ids=["one character", "two characters"])
def test_the_plan_is_what_the_pipeline_leaves_on_the_gpu_at_each_stage(characters, placement):
    pipelines = full_size_pipelines(characters, placement)
    rank = RANK if len(characters) > 1 else 0
    expected = full_plan(len(characters), rank)
    for pipe in reversed(pipelines):  # the second character's turn first: switching is part of it
        measured = stages_of_a_turn(pipe, lambda: bytes_on_gpu(pipelines))
        assert measured == {stage: expected.weights_on_gpu(stage, placement) for stage in STAGES}
    assert bytes_on_gpu(pipelines) == expected.weights_on_gpu("vae", placement)  # visits leave nothing behind


def test_one_character_resident_needs_17_gib_of_weights_at_every_stage():
    p = full_plan()
    weights = p.weights_on_gpu("denoise", Placement()) / GIB
    assert 17.0 < weights < 17.3  # 13.6 GiB MLLM + 3.2 GiB decoder + 0.4 GiB VAE, all bf16
    assert {p.weights_on_gpu(s, Placement()) for s in STAGES} == {p.weights_on_gpu("denoise", Placement())}


def test_offloading_the_mllm_alone_still_keeps_the_decoder_beside_it_during_its_passes():
    """The old plan's mistake: the MLLM pass peak is the MLLM plus the resident decoder and VAE, not the MLLM."""
    p = full_plan()
    mllm_pass = p.weights_on_gpu("state_pass", Placement(offload_mllm=True))
    assert mllm_pass == p.weights_on_gpu("state_pass", Placement())
    assert p.weights_on_gpu("state_pass", Placement(True, True)) < mllm_pass - 3 * GIB


def test_one_24_gb_card_serves_both_published_characters():
    two = full_plan(characters=2, lora_rank=RANK)
    card = 22 * GIB  # a 24 GB card, less the CUDA context
    placement = two.choose(card)
    assert placement.offload_mllm  # the 13 GiB base visits for its passes; a decoder then fits beside the other
    assert two.peak(placement) <= card < two.peak(Placement())
    assert round(two.peak(placement) / GIB, 1) == 21.5  # the figure in docs/published-model.md


def test_the_placement_that_fits_and_moves_least_is_chosen():
    one = full_plan()
    assert one.choose(139 * GIB) == Placement()  # an H200 keeps everything resident
    assert one.peak(Placement(False, True)) == one.peak(Placement())  # alone, its decoder is needed at the peak
    assert one.choose(one.peak(Placement(True, False))) == Placement(True, False)
    two = full_plan(characters=2, lora_rank=RANK)
    budget = two.peak(Placement(False, True))
    assert two.peak(Placement(True, False)) <= budget < two.peak(Placement())
    assert two.choose(budget) == Placement(False, True)  # both fit; a 3 GiB decoder moves faster than the 13 GiB base


def test_a_card_too_small_for_any_placement_is_refused_with_each_placements_need():
    with pytest.raises(NotEnoughGPUMemory, match=r"8\.0 GiB free.*2 characters.*everything resident.*ANIMEGAMER_"):
        full_plan(characters=2, lora_rank=RANK).choose(8 * GIB)


def test_pinned_settings_leave_only_their_placements():
    assert allowed_placements("on", "off") == (Placement(True, False),)
    assert allowed_placements("auto", "auto") == PLACEMENTS
    with pytest.raises(NotEnoughGPUMemory):
        full_plan().choose(15 * GIB, allowed_placements("off", "off"))
