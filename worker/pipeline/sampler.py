"""The release's sampler, written from its math: zero-terminal-SNR shifted DDPM schedule, DPM-Solver++(2M) SDE.

No diffusers scheduler is used because diffusers' ``CogVideoXDPMScheduler`` is close to, but not the same as, what
the release runs (ANIMEGAMER.md, "Sampler"). The model is a v-predictor: ``x0 = sqrt(a) * x - sqrt(1 - a) * v``.

Two details of the release (CogVideoX's SAT ``ZeroSNRDDPMDiscretization`` and ``VPSDEDPMPP2MSampler``) are kept:

- Timesteps are ``np.linspace(T - 1, 0, n, endpoint=False).astype(int)``: for 50 steps 999, 979, ..., 19.
- At inference the zero-terminal-SNR rescale is applied to the *sampled* timesteps' alphas, not to the whole
  1000-entry table (:func:`release_alphas_cumprod`, the one training draws from). Both end at 0; they differ by
  about 0.1% in sqrt(alpha) in between. :func:`sampling_alphas_cumprod` is the inference version.

One detail is kept only with ``SamplerConfig.numerics = "release"``: the release's denoiser rounds the sampler's
sqrt(alpha) to the nearest entry of the 1000-step table before it forms c_skip = sqrt(a) and c_out = -sqrt(1 - a)
(``DiscreteDenoiser.possibly_quantize_sigma`` in TencentARC/AnimeGamer ``VDM_Decoder/sgm/modules/diffusionmodules/
denoiser.py``, with ``VideoScaling`` and ``ZeroSNRDDPMDiscretization`` of CogVideoX's ``sat/sgm/modules/
diffusionmodules/denoiser_scaling.py`` and ``discretizer.py``, which the release's config names;
``quantize_c_noise`` is off there, so the model is still fed the unrounded timestep). The step's update
coefficients keep the unrounded alphas. By default x0 uses the sampler's own alpha, the one its update assumes.
Rounding is a no-op in training (sigmas are drawn from the table there) and at inference does not reliably give
the fed timestep's training alpha either: for 50 steps the nearest entry is t itself down to t = 179 and t - 1
below; for 10 steps t = 99 rounds to 95, for 2 steps t = 499 to 473. Over a 50-step run it moves c_skip by up to
0.1% and c_out by up to 0.7% (at t = 19).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import get_args

import numpy as np
import torch

from worker.pipeline.config import Numerics, SamplerConfig

logger = logging.getLogger(__name__)

NUM_TRAIN_TIMESTEPS = 1000
BETA_START = 0.00085
BETA_END = 0.012

PredictV = Callable[[torch.Tensor, int, int], torch.Tensor]
StepCallback = Callable[[int, int], None]


def _shifted_alphas_cumprod(shift_scale: float, num_train_timesteps: int) -> torch.Tensor:
    """Scaled-linear DDPM alphas_cumprod with the SNR divided by `shift_scale` (float64, `[num_train_timesteps]`)."""
    betas = torch.linspace(math.sqrt(BETA_START), math.sqrt(BETA_END), num_train_timesteps, dtype=torch.float64) ** 2
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
    # a / (s - (s - 1) a) divides a / (1 - a) by s: log-SNR shifted down by log(s), more noise at every t.
    return alphas_cumprod / (shift_scale - (shift_scale - 1.0) * alphas_cumprod)


def _rescale_zero_terminal_snr(alphas_cumprod: torch.Tensor) -> torch.Tensor:
    """Lin et al. 2024: move sqrt(a) so the last entry is exactly 0 while the first keeps its value."""
    s = alphas_cumprod.sqrt()
    s0, s_last = s[0].clone(), s[-1].clone()
    s = (s - s_last) * s0 / (s0 - s_last)
    return s**2


def release_alphas_cumprod(shift_scale: float = 3.0, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS) -> torch.Tensor:
    """The full training table: shifted, then rescaled to zero terminal SNR over all timesteps.

    Returns a float64 tensor of shape `[num_train_timesteps]` whose last entry is exactly 0.
    """
    return _rescale_zero_terminal_snr(_shifted_alphas_cumprod(shift_scale, num_train_timesteps))


def sampling_timesteps(num_steps: int, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS) -> list[int]:
    """Descending timesteps of an `num_steps`-step run; for 50 steps 999, 979, ..., 19.

    Uses the release's float `linspace` then truncation, i.e. `floor((T - 1) * (1 - k / n))`; for step counts that
    divide 1000 this equals `(k + 1) * T / n - 1`.
    """
    if not 1 <= num_steps <= num_train_timesteps:
        raise ValueError(f"num_steps must be in 1..{num_train_timesteps}, got {num_steps}")
    steps = np.linspace(num_train_timesteps - 1, 0, num_steps, endpoint=False).astype(int)
    return [int(t) for t in steps]


def sampling_alphas_cumprod(
    timesteps: Sequence[int], shift_scale: float = 3.0, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS
) -> torch.Tensor:
    """alphas_cumprod at `timesteps` (descending) as the release's inference computes them (float64, `[n]`).

    The zero-terminal-SNR rescale runs over the selected entries only, so the smallest timestep keeps its shifted
    value and the largest (999) gets a = 0.
    """
    if len(timesteps) == 1:
        return torch.zeros(1, dtype=torch.float64)  # one step starts (and ends) at pure noise: a = 0
    s = _shifted_alphas_cumprod(shift_scale, num_train_timesteps)[torch.tensor(list(timesteps))].sqrt()
    s_first, s_last = s.max(), s.min()  # alphas fall with t: smallest timestep first, largest last
    return ((s - s_last) * s_first / (s_first - s_last)) ** 2


def guidance_weight(
    step_index: int,
    timestep: int,
    num_steps: int,
    scale: float = 6.0,
    exponent: float = 5.0,
    mode: Numerics = "intended",
) -> float:
    """Dynamic CFG weight w(s) = 1 + scale * (1 - cos(pi * (s / num_steps) ** exponent)) / 2.

    "intended": s = step_index, so w rises smoothly from 1 to about 1 + scale. "release": s = num_steps - timestep,
    what the release actually passes; (s / n) ** 5 is then a large negative number and w jumps between about 1 and
    1 + scale from one step to the next.
    """
    if mode == "intended":
        s = float(step_index)
    elif mode == "release":
        s = float(num_steps - timestep)
    else:
        raise ValueError(f"unknown numerics {mode!r}; use 'intended' or 'release'")
    return 1.0 + scale * (1.0 - math.cos(math.pi * (s / num_steps) ** exponent)) / 2.0


def quantize_alphas_cumprod(alphas_cumprod: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Each of `alphas_cumprod` replaced by the `table` entry nearest to it in sqrt(alpha), as the release's denoiser.

    `table` is indexed by timestep (ascending t, falling alpha); a tie goes to the smaller timestep, like the
    release's ``argmin``. The release rounds in float32, this in float64; for every step count in the tests the
    chosen entries agree. Returns a tensor of the shape and dtype of `alphas_cumprod`.
    """
    distance = (alphas_cumprod.sqrt()[:, None] - table.sqrt()[None, :]).abs()  # (n, T)
    return table[distance.argmin(dim=1)].to(alphas_cumprod.dtype)


def _log_snr(alpha_cumprod: float) -> float:
    """lambda = log(sqrt(a / (1 - a))); -inf at pure noise (a = 0)."""
    if alpha_cumprod <= 0.0:
        return -math.inf
    return 0.5 * (math.log(alpha_cumprod) - math.log1p(-alpha_cumprod))


class DPMSolverSDESampler:
    """DPM-Solver++(2M) SDE on the VP schedule, as the release's ``VPSDEDPMPP2MSampler``.

    Per step t -> t' with h = lambda(t') - lambda(t):
    x' = sqrt((1 - a') / (1 - a)) e^-h x - expm1(-2h) sqrt(a') D + sqrt(1 - a') sqrt(-expm1(-2h)) z,
    D = x0_hat on the first step, (1 + 1/2r) x0_hat - (1/2r) x0_hat_prev after it (r = h_last / h), and the last
    step returns x0_hat itself. x0_hat = sqrt(a) x - sqrt(1 - a) v takes its a from `denoiser_alphas_cumprod`, the
    schedule's own alphas unless numerics is "release" (module docstring). Schedule arithmetic is float64 (Python
    floats); tensors stay in the noise's dtype.
    """

    def __init__(self, config: SamplerConfig, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS) -> None:
        if config.num_steps < 1:
            raise ValueError(f"num_steps must be at least 1, got {config.num_steps}")
        if config.numerics not in get_args(Numerics):
            raise ValueError(f"unknown numerics {config.numerics!r}; use 'intended' or 'release'")
        self.config = config
        self.num_steps = config.num_steps
        self.timesteps: list[int] = sampling_timesteps(config.num_steps, num_train_timesteps)
        # (num_steps,) float64, aligned with self.timesteps; [0] is 0 (pure noise). The update steps use these.
        self.alphas_cumprod: torch.Tensor = sampling_alphas_cumprod(
            self.timesteps, config.shift_scale, num_train_timesteps
        )
        # (num_steps,) float64: the alphas x0 is formed with, rounded to the training table in release numerics
        self.denoiser_alphas_cumprod: torch.Tensor = self.alphas_cumprod
        if config.numerics == "release":
            table = release_alphas_cumprod(config.shift_scale, num_train_timesteps)
            self.denoiser_alphas_cumprod = quantize_alphas_cumprod(self.alphas_cumprod, table)

    def guidance(self, step_index: int) -> float:
        """This run's CFG weight at `step_index`, per the config's scale, exponent and mode."""
        return guidance_weight(
            step_index,
            self.timesteps[step_index],
            self.num_steps,
            scale=self.config.guidance_scale,
            exponent=self.config.guidance_exponent,
            mode=self.config.numerics,
        )

    def skips_unconditional(self, step_index: int) -> bool:
        """Whether `step_index` runs the conditional half alone: no guidance at all, or a weight within
        `skip_unconditional_below` of 1, where the unconditional half would (all but) cancel out."""
        if not self.config.guidance_scale:
            return True
        return self.guidance(step_index) - 1.0 <= self.config.skip_unconditional_below

    def _coefficients(self, i: int) -> tuple[float, float, float, float]:
        """(c_x, c_d, c_z, c_prev) for step i -> i+1: x' = c_x x + c_d D + c_z z, with 1/2r = c_prev.

        At a = 0 (lambda = -inf, h = +inf) the limits are taken explicitly: e^-h = 0, expm1(-2h) = -1, and a step
        after it has h_last = inf, so 1/2r = 0 and the second-order correction vanishes.
        """
        a, a_next = float(self.alphas_cumprod[i]), float(self.alphas_cumprod[i + 1])
        lam, lam_next = _log_snr(a), _log_snr(a_next)
        if math.isinf(lam):
            exp_neg_h, expm1_neg_2h, h = 0.0, -1.0, math.inf
        else:
            h = lam_next - lam
            exp_neg_h, expm1_neg_2h = math.exp(-h), math.expm1(-2.0 * h)
        c_x = math.sqrt((1.0 - a_next) / (1.0 - a)) * exp_neg_h
        c_d = -expm1_neg_2h * math.sqrt(a_next)
        c_z = math.sqrt(1.0 - a_next) * math.sqrt(-expm1_neg_2h)
        c_prev = 0.0
        if i > 0:
            lam_prev = _log_snr(float(self.alphas_cumprod[i - 1]))
            h_last = lam - lam_prev
            c_prev = 0.0 if math.isinf(h_last) else h / (2.0 * h_last)  # 1 / (2r), r = h_last / h
        return c_x, c_d, c_z, c_prev

    @torch.no_grad()
    def sample(
        self,
        predict_v: PredictV,
        noise: torch.Tensor,
        generator: torch.Generator,
        callback: StepCallback | None = None,
    ) -> torch.Tensor:
        """Denoise `noise` (any shape, e.g. latents `(B, F, C, H, W)`) into an x0 estimate of the same shape and dtype.

        `predict_v(x, timestep, step_index)` returns the (already guided) v-prediction. `generator` must be a CPU
        generator: the per-step noise is drawn on the CPU in float32 and moved, so a seed gives the same clip on any
        device. `callback(step_index, num_steps)` runs after every step; raising from it cancels the run.
        """
        if generator.device.type != "cpu":
            raise ValueError("generator must be a CPU torch.Generator so that results do not depend on the device")
        x = noise  # a(t=999) = 0: the start is pure noise, no scaling
        x0_prev: torch.Tensor | None = None
        for i, t in enumerate(self.timesteps):
            a = float(self.denoiser_alphas_cumprod[i])
            v = predict_v(x, t, i).to(x.dtype)
            x0 = math.sqrt(a) * x - math.sqrt(1.0 - a) * v  # c_skip x + c_out v

            if i == self.num_steps - 1:
                x = x0  # the last step returns the x0 estimate directly
            else:
                c_x, c_d, c_z, c_prev = self._coefficients(i)
                d = x0 if x0_prev is None else (1.0 + c_prev) * x0 - c_prev * x0_prev
                z = torch.randn(x.shape, generator=generator, dtype=torch.float32, device="cpu")
                x = c_x * x + c_d * d + c_z * z.to(device=x.device, dtype=x.dtype)
                x0_prev = x0

            if callback is not None:
                callback(i, self.num_steps)
        return x
