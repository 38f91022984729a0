"""The release's sampler: schedule, guidance weights and the DPM-Solver++(2M) SDE loop.

Reference values are recomputed here with numpy straight from the formulas, not from the module under test.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from worker.pipeline.config import tiny
from worker.pipeline.sampler import (
    DPMSolverSDESampler,
    guidance_weight,
    quantize_alphas_cumprod,
    release_alphas_cumprod,
    sampling_alphas_cumprod,
    sampling_timesteps,
)

SAMPLER = tiny().sampler
SHAPE = (1, 5, 4, 8, 12)  # tiny latents (B, F, C, H, W)


def _np_shifted(shift: float = 3.0) -> np.ndarray:
    betas = np.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=np.float64) ** 2
    a = np.cumprod(1.0 - betas)
    return a / (shift - (shift - 1.0) * a)


def _np_zero_snr(a: np.ndarray) -> np.ndarray:
    s = np.sqrt(a)
    return ((s - s[-1]) * s[0] / (s[0] - s[-1])) ** 2


def _np_release_sqrt_alphas(timesteps: list[int] | None = None) -> np.ndarray:
    """sqrt(alpha) the way the release's discretisation makes it: the float64 table cast to float32, square-rooted
    and rescaled in float32, over the whole table (ascending t) or over `timesteps` only (in their order)."""
    a = _np_shifted() if timesteps is None else _np_shifted()[sorted(timesteps)]
    s = np.sqrt(a.astype(np.float32))
    s = (s - s[-1]) * (s[0] / (s[0] - s[-1]))
    return s if timesteps is None else s[np.argsort(np.argsort(timesteps))]


def _np_denoiser_sqrt_alphas(timesteps: list[int]) -> np.ndarray:
    """The release denoiser's c_skip per step: the sampler's sqrt(alpha) moved to the nearest 1000-table entry."""
    table = _np_release_sqrt_alphas()
    return table[np.abs(_np_release_sqrt_alphas(timesteps)[:, None] - table[None, :]).argmin(axis=1)]


# --- schedule ---------------------------------------------------------------------------------------------------


def test_alphas_cumprod_match_the_formula() -> None:
    expected = _np_zero_snr(_np_shifted())
    got = release_alphas_cumprod(3.0).numpy()
    assert got.dtype == np.float64 and got.shape == (1000,)
    for t in (0, 19, 499, 998):
        assert got[t] == pytest.approx(expected[t], rel=1e-12)
    assert got[999] == 0.0
    assert got[0] == pytest.approx(0.99745433, abs=1e-8)


def test_alphas_cumprod_fall_monotonically_to_zero() -> None:
    a = release_alphas_cumprod()
    assert (a[1:] < a[:-1]).all()
    assert a[-1] == 0.0


def test_shift_divides_the_snr_by_the_shift_scale() -> None:
    # Before the zero-SNR rescale, a/(1-a) of the shifted table is the unshifted one over 3.
    unshifted, shifted = _np_shifted(1.0), _np_shifted(3.0)
    np.testing.assert_allclose(shifted / (1 - shifted), unshifted / (1 - unshifted) / 3.0, rtol=1e-12)


def test_fifty_steps_run_999_979_down_to_19() -> None:
    assert sampling_timesteps(50) == list(range(999, 0, -20))


@pytest.mark.parametrize("num_steps", [1, 3, 4, 7, 25, 1000])
def test_other_step_counts_are_descending_and_start_at_999(num_steps: int) -> None:
    steps = sampling_timesteps(num_steps)
    assert len(steps) == num_steps
    assert steps[0] == 999
    assert all(a > b for a, b in itertools.pairwise(steps))
    assert steps[-1] >= 0


def test_sampling_alphas_rescale_over_the_sampled_timesteps() -> None:
    steps = sampling_timesteps(50)
    a = sampling_alphas_cumprod(steps).numpy()
    expected = _np_zero_snr(_np_shifted()[steps[::-1]])[::-1]  # rescale the 50 ascending-t entries
    np.testing.assert_allclose(a, expected, rtol=1e-12, atol=0)
    assert a[0] == 0.0  # t = 999: pure noise
    assert a[-1] == pytest.approx(_np_shifted()[19], rel=1e-12)  # the smallest t keeps its shifted value
    # within 0.2% (in sqrt a) of the 1000-entry training table
    np.testing.assert_allclose(np.sqrt(a), np.sqrt(release_alphas_cumprod().numpy()[steps]), atol=2e-3)


# --- guidance ---------------------------------------------------------------------------------------------------


def test_intended_guidance_rises_from_1_to_6_86() -> None:
    steps = sampling_timesteps(50)
    w = [guidance_weight(i, t, 50, mode="intended") for i, t in enumerate(steps)]
    assert w[0] == 1.0
    assert w[49] == pytest.approx(1 + 6 * (1 - math.cos(math.pi * 0.98**5)) / 2) == pytest.approx(6.864, abs=1e-3)
    assert all(a <= b for a, b in itertools.pairwise(w))


def test_release_guidance_jumps_between_about_1_and_7() -> None:
    steps = sampling_timesteps(50)
    w = [guidance_weight(i, t, 50, mode="release") for i, t in enumerate(steps)]
    expected = [1 + 6 * (1 - math.cos(math.pi * ((50 - t) / 50) ** 5)) / 2 for t in steps]
    assert w == pytest.approx(expected)
    assert min(w) < 1.1 and max(w) > 6.9
    assert max(abs(a - b) for a, b in itertools.pairwise(w)) > 4.0  # neighbours far apart


def test_unknown_guidance_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown numerics"):
        guidance_weight(0, 999, 50, mode="linear")  # type: ignore[arg-type]


def test_a_sampler_of_unknown_numerics_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown numerics 'exact'"):
        DPMSolverSDESampler(replace(SAMPLER, numerics="exact"))  # type: ignore[arg-type]


def test_sampler_guidance_uses_the_configured_mode() -> None:
    sampler = DPMSolverSDESampler(replace(SAMPLER, numerics="release"))
    assert sampler.guidance(3) == guidance_weight(3, sampler.timesteps[3], 50, mode="release")


# --- the denoiser's alphas -----------------------------------------------------------------------------------------


def test_release_numerics_round_x0s_alphas_to_the_1000_step_table() -> None:
    sampler = DPMSolverSDESampler(replace(SAMPLER, numerics="release"))
    expected = _np_denoiser_sqrt_alphas(sampler.timesteps)
    np.testing.assert_allclose(sampler.denoiser_alphas_cumprod.sqrt().numpy(), expected, rtol=1e-6, atol=1e-7)
    # the nearest entry is t itself down to t = 179 and t - 1 below, where the rescales drift apart the most
    table = np.sqrt(release_alphas_cumprod().numpy())
    nearest = [int(np.abs(table - value).argmin()) for value in expected]
    assert nearest == [t if t >= 179 else t - 1 for t in sampler.timesteps]


def test_intended_numerics_form_x0_with_the_schedules_own_alphas() -> None:
    sampler = DPMSolverSDESampler(SAMPLER)
    assert torch.equal(sampler.denoiser_alphas_cumprod, sampler.alphas_cumprod)


def test_quantize_rounds_in_sqrt_alpha_and_breaks_ties_to_the_smaller_timestep() -> None:
    table = torch.tensor([0.5625, 0.25, 0.0625], dtype=torch.float64)  # sqrt: 0.75, 0.5, 0.25, all exact
    # in the table; sqrt 0.625, exactly halfway; sqrt 0.63, nearer 0.75 in sqrt but nearer 0.25 in alpha
    probe = torch.tensor([0.25, 0.625**2, 0.63**2], dtype=torch.float64)
    expected = torch.tensor([0.25, 0.5625, 0.5625], dtype=torch.float64)
    torch.testing.assert_close(quantize_alphas_cumprod(probe, table), expected, rtol=0, atol=0)


def test_release_numerics_return_the_last_x0_from_the_rounded_alpha() -> None:
    sampler = DPMSolverSDESampler(replace(SAMPLER, numerics="release"))
    seen: dict[int, torch.Tensor] = {}

    def predict(x: torch.Tensor, timestep: int, step_index: int) -> torch.Tensor:
        seen[step_index] = x.clone()
        return torch.cos(x)

    noise = torch.randn(2, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    out = sampler.sample(predict, noise, torch.Generator().manual_seed(9)).numpy()
    x = seen[49].numpy()
    c_skip = float(_np_denoiser_sqrt_alphas(sampler.timesteps)[-1])  # the 1000-table's entry 18, not the run's 19
    c_out = -math.sqrt(1.0 - c_skip**2)
    np.testing.assert_allclose(out, c_skip * x + c_out * np.cos(x), rtol=0, atol=1e-6)


# --- the loop ---------------------------------------------------------------------------------------------------


def _zero_v(x: torch.Tensor, timestep: int, step_index: int) -> torch.Tensor:
    return torch.zeros_like(x)


def test_same_seed_gives_identical_output() -> None:
    sampler = DPMSolverSDESampler(SAMPLER)
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))

    def run(seed: int) -> torch.Tensor:
        return sampler.sample(lambda x, t, i: 0.1 * x, noise, torch.Generator().manual_seed(seed))

    assert torch.equal(run(7), run(7))
    assert not torch.equal(run(7), run(8))


def test_oracle_predictor_returns_its_target() -> None:
    sampler = DPMSolverSDESampler(SAMPLER)
    alphas = sampler.alphas_cumprod
    target = torch.randn(SHAPE, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def oracle(x: torch.Tensor, timestep: int, step_index: int) -> torch.Tensor:
        a = float(alphas[step_index])
        return (math.sqrt(a) * x - target) / math.sqrt(1 - a)  # the v whose x0 is `target`

    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out = sampler.sample(oracle, noise, torch.Generator().manual_seed(4))
    torch.testing.assert_close(out, target, rtol=0, atol=1e-12)


def test_predictor_and_callback_run_once_per_step_in_order() -> None:
    sampler = DPMSolverSDESampler(replace(SAMPLER, num_steps=7))
    calls: list[tuple[int, int]] = []
    progress: list[tuple[int, int]] = []

    def predict(x: torch.Tensor, timestep: int, step_index: int) -> torch.Tensor:
        calls.append((timestep, step_index))
        return torch.zeros_like(x)

    sampler.sample(predict, torch.randn(SHAPE), torch.Generator().manual_seed(0), lambda i, n: progress.append((i, n)))
    assert calls == list(zip(sampling_timesteps(7), range(7), strict=True))
    assert progress == [(i, 7) for i in range(7)]


def test_raising_from_the_callback_cancels_the_run() -> None:
    sampler = DPMSolverSDESampler(SAMPLER)
    seen: list[int] = []

    def predict(x: torch.Tensor, timestep: int, step_index: int) -> torch.Tensor:
        seen.append(step_index)
        return torch.zeros_like(x)

    def cancel_at_3(i: int, n: int) -> None:
        if i == 3:
            raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt):
        sampler.sample(predict, torch.randn(SHAPE), torch.Generator().manual_seed(0), cancel_at_3)
    assert seen == [0, 1, 2, 3]


@pytest.mark.parametrize("numerics", ["intended", "release"])
def test_steps_follow_the_sde_update_computed_independently(numerics: str) -> None:
    n = 4
    sampler = DPMSolverSDESampler(replace(SAMPLER, num_steps=n, numerics=numerics))  # type: ignore[arg-type]
    noise = torch.randn(2, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    predict = lambda x, t, i: torch.sin(x) + 0.1 * i  # noqa: E731 - any deterministic model will do
    out = sampler.sample(predict, noise, torch.Generator().manual_seed(6))

    # numpy reference: same formulas, same noise stream; the release rounds only x0's alpha (749 -> 745 and so on)
    a = sampling_alphas_cumprod(sampling_timesteps(n)).numpy()
    a_x0 = a if numerics == "intended" else _np_denoiser_sqrt_alphas(sampling_timesteps(n)).astype(np.float64) ** 2
    lam = [-np.inf if ai == 0 else np.log(np.sqrt(ai / (1 - ai))) for ai in a]
    g = torch.Generator().manual_seed(6)
    x, x0_prev, h_prev = noise.numpy().copy(), None, None
    for i in range(n):
        x0 = np.sqrt(a_x0[i]) * x - np.sqrt(1 - a_x0[i]) * (np.sin(x) + 0.1 * i)
        if i == n - 1:
            x = x0
            break
        h = lam[i + 1] - lam[i]
        if x0_prev is None or np.isinf(h_prev):
            d = x0  # first order (also right after the a = 0 step, where r = inf)
        else:
            r = h_prev / h
            d = (1 + 1 / (2 * r)) * x0 - 1 / (2 * r) * x0_prev
        z = torch.randn(2, 3, generator=g).double().numpy()
        x = (
            np.sqrt((1 - a[i + 1]) / (1 - a[i])) * np.exp(-h) * x
            - np.expm1(-2 * h) * np.sqrt(a[i + 1]) * d
            + np.sqrt(1 - a[i + 1]) * np.sqrt(-np.expm1(-2 * h)) * z
        )
        x0_prev, h_prev = x0, h
    tolerance = 1e-10 if numerics == "intended" else 1e-6  # the release's table is float32
    np.testing.assert_allclose(out.numpy(), x, rtol=tolerance, atol=tolerance)


def test_first_step_from_pure_noise_has_no_nan() -> None:
    sampler = DPMSolverSDESampler(replace(SAMPLER, num_steps=2))
    out = sampler.sample(_zero_v, torch.randn(SHAPE), torch.Generator().manual_seed(0))
    assert torch.isfinite(out).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to build a CUDA generator")
def test_a_cuda_generator_is_rejected() -> None:
    sampler = DPMSolverSDESampler(SAMPLER)
    with pytest.raises(ValueError, match="CPU"):
        sampler.sample(_zero_v, torch.randn(SHAPE), torch.Generator(device="cuda"))
