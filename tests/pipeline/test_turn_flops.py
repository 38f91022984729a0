"""benchmarks/turn_flops.py counts the forwards a turn is made of once, on the meta device, and composes each way of
playing a turn from them: these check that the composition is the work the pipeline's own code does, counted on a
real processor at the tiny sizes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from benchmarks import turn_flops
from worker.pipeline.config import get_config
from worker.pipeline.pipeline import AnimeGamerPipeline
from worker.pipeline.sampler import DPMSolverSDESampler

# Six steps, a tolerance at which some but not all of them run the conditional half alone.
SAMPLER = replace(get_config("tiny").sampler, num_steps=6, skip_unconditional_below=0.05)
RELEASE_BUDGET = 5


@pytest.fixture(scope="module")
def config():
    return replace(get_config("tiny"), sampler=SAMPLER)


@pytest.fixture(scope="module")
def counted(config) -> turn_flops.Counted:
    return turn_flops.count(config, past_turns=1, release_budget=RELEASE_BUDGET)


@pytest.fixture(scope="module")
def pipe(config) -> AnimeGamerPipeline:
    return AnimeGamerPipeline.random_weights(config, "cpu")


def flops_of(fn: Callable[..., object], *args: object) -> int:
    with torch.no_grad():
        return turn_flops.counted(fn, *args)[1]


def test_the_counted_state_pass_is_the_four_forwards_the_pipeline_makes(counted, pipe) -> None:
    _, embeds = turn_flops.turn_prompt(pipe, past_turns=1)
    ran = flops_of(pipe.mllm.predict_states, embeds, pipe.tokenizer)
    assert len(counted.state_ours) == 4
    assert sum(forward.flops for forward in counted.state_ours) == ran > 0


def test_the_counted_release_state_pass_is_one_forward_per_generated_token(counted, pipe) -> None:
    _, embeds = turn_flops.turn_prompt(pipe, past_turns=1)
    ids = pipe.mllm.release_generate(embeds, pipe.tokenizer, RELEASE_BUDGET)
    ran = flops_of(pipe.mllm.release_generate, embeds, pipe.tokenizer, RELEASE_BUDGET)
    assert len(ids) == RELEASE_BUDGET, "random weights should not reach EOS this soon"
    assert sum(forward.flops for forward in counted.state_release) == ran


def test_the_counted_representation_pass_is_the_pipeline_s(counted, pipe) -> None:
    prompt, embeds = turn_flops.turn_prompt(pipe, past_turns=1)
    assert counted.representation.flops == flops_of(pipe.mllm.predict_representation, embeds, prompt) > 0


def test_the_counted_denoising_loop_is_the_pipeline_s_with_its_skipped_halves(counted, pipe) -> None:
    sampler = DPMSolverSDESampler(SAMPLER)
    alone = sum(sampler.skips_unconditional(i) for i in range(SAMPLER.num_steps))
    representation = torch.zeros(1, pipe.config.num_query_tokens, pipe.config.decoder.hidden_size)
    ran = flops_of(pipe.denoise, representation, 1.0, 0, lambda *_: None)
    work = counted.turn(SAMPLER)
    assert 0 < alone < SAMPLER.num_steps  # both kinds of step are in the run
    assert counted.pair.flops == 2 * counted.single.flops
    assert work.flops("denoise") == ran


def test_the_release_s_way_runs_its_generated_state_pass_and_the_cfg_pair_at_every_step(counted) -> None:
    release = counted.turn(SAMPLER, release=True)
    state = sum(f.flops for f in counted.state_release)
    assert release.flops("state pass") == state
    assert release.flops("denoise") == counted.unconditional.flops + SAMPLER.num_steps * counted.pair.flops
    assert release.flops() > counted.turn(SAMPLER).flops()  # ours skips halves at this sampler's tolerance
