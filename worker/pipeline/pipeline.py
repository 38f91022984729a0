"""The AnimeGamer pipeline: one TurnRequest in, one TurnResult out.

Reads top to bottom like a diffusers pipeline: check inputs, build the prompt, the MLLM's two
passes (state tokens, then the representation), the denoising loop with dynamic CFG over the
motion-scope-conditioned decoder, the VAE, MP4 encoding. Progress and cancellation go through
``on_progress``; nothing application-specific lives in the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from game.contract import ProgressFn, Stage, TurnRequest, TurnResult, inline
from game.motion import flow_for
from game.safety import SafetyReport, unchecked
from game.state import StateDeltas
from media.mp4 import encode_mp4
from worker.pipeline.characters import SharedMLLM
from worker.pipeline.config import PipelineConfig
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.memory import Placement
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.offload import visiting
from worker.pipeline.prompt import build_prompt
from worker.pipeline.sampler import DPMSolverSDESampler
from worker.pipeline.step_cache import StepCache
from worker.pipeline.tokenizer import AnimeGamerTokenizer, ByteBase
from worker.pipeline.vae import build_vae, conv3d_by_frames, decode_latents
from worker.safety import ClipChecker

log = logging.getLogger(__name__)

ANY_CHARACTER = "*"  # random-weight and toy models are no one character's
REPRESENTATION_KEY = "representation"


class PipelineLoadError(RuntimeError):
    """The pipeline cannot be built here; the message says why and what to do instead."""


@dataclass
class Rendered:
    """A turn before its clip is encoded."""

    deltas: StateDeltas
    flow: float
    representation: torch.Tensor  # (1, 226, D)
    frames: np.ndarray  # (T, H, W, 3) uint8
    timings: dict[str, float]


@dataclass
class AnimeGamerPipeline:
    config: PipelineConfig
    tokenizer: AnimeGamerTokenizer
    mllm: AnimeGamerMLLM
    decoder: AnimeGamerDecoder
    vae: torch.nn.Module
    device: torch.device
    mllm_dtype: torch.dtype
    decoder_dtype: torch.dtype  # the VAE's too
    offload_mllm: bool = False  # the MLLM lives in host memory and visits the GPU for its two passes
    offload_decoder: bool = False  # the decoder lives in host memory and visits the GPU for denoising
    shared: SharedMLLM | None = None  # one MLLM base serving several characters' pipelines
    character: str = ""  # whose parts ``shared`` switches to before this pipeline's MLLM passes
    steps_reused: int = 0  # the last turn's denoising steps the step cache answered (benchmarks/compute_cuts.py)
    # The nudity detector over every clip (worker/safety.py), as diffusers' pipelines carry a safety checker; None:
    # the clip leaves unchecked and the bot withholds it.
    safety_checker: ClipChecker | None = None

    def __post_init__(self) -> None:
        if self.device.type == "cpu":
            conv3d_by_frames(self.vae)  # oneDNN's 2D convolutions instead of the CPU's slow 3D path (vae.py)

    @classmethod
    def random_weights(
        cls,
        config: PipelineConfig,
        device: str = "cpu",
        *,
        mllm_dtype: torch.dtype | None = None,
        decoder_dtype: torch.dtype | None = None,
        offload_mllm: bool = False,
        offload_decoder: bool = False,
        tokenizer: AnimeGamerTokenizer | None = None,
    ) -> AnimeGamerPipeline:
        """The architecture at the config's sizes with seeded random weights (labelled as such); the tokenizer is
        bytes over the config's base vocabulary unless one is given (the toy model's reads words).

        Modules are built directly on the target device in their target dtype: a 7 B model built in
        float32 on the CPU first would need 29 GB of host memory and minutes of initialisation.
        """
        torch_device = torch.device(device)
        on_cpu = torch_device.type == "cpu"
        # float32 on the CPU, where half-precision matmuls are slow; bf16 on a GPU, as the release runs the MLLM.
        mllm_dtype = mllm_dtype or (torch.float32 if on_cpu else torch.bfloat16)
        decoder_dtype = decoder_dtype or (torch.float32 if on_cpu else torch.bfloat16)
        torch.manual_seed(config.weights_seed)
        tokenizer = tokenizer or AnimeGamerTokenizer(ByteBase(vocab_size=config.mllm.base_vocab_size))
        if tokenizer.base_vocab_size != config.mllm.base_vocab_size:
            raise ValueError(
                f"the tokenizer has {tokenizer.base_vocab_size} base ids, the MLLM {config.mllm.base_vocab_size}"
            )
        home = torch.device("cpu") if offload_mllm else torch_device
        with home, _default_dtype(mllm_dtype):
            mllm = AnimeGamerMLLM(
                config.mllm, tokenizer.vocab_size, config.decoder.hidden_size, num_query_tokens=config.num_query_tokens
            )
        with torch.device("cpu") if offload_decoder else torch_device, _default_dtype(decoder_dtype):
            decoder = AnimeGamerDecoder.from_pipeline_config(config.decoder)
        with torch_device, _default_dtype(decoder_dtype):
            vae = build_vae(config.vae)
        for module in (mllm, decoder, vae):
            module.eval()
        return cls(
            config,
            tokenizer,
            mllm,
            decoder,
            vae,
            torch_device,
            mllm_dtype,
            decoder_dtype,
            offload_mllm,
            offload_decoder=offload_decoder,
        )

    @torch.no_grad()
    def __call__(self, request: TurnRequest, on_progress: ProgressFn | None = None) -> TurnResult:
        report = on_progress or (lambda stage, step, total: None)
        cfg = self.config
        clip = self.render(request, report)

        # 6. Check the frames before they become a clip anyone can post.
        report(Stage.SAFETY, 0, 1)
        with _timed(clip.timings, "safety"):
            safety = self.check(clip.frames)
        report(Stage.SAFETY, 1, 1)

        # 7. Encode the clip.
        report(Stage.ENCODE, 0, 1)
        with _timed(clip.timings, "encode"):
            mp4 = encode_mp4(clip.frames, cfg.fps)
        report(Stage.ENCODE, 1, 1)

        return TurnResult(
            job_id=request.job_id,
            model=cfg.name,
            label=cfg.label,
            seed=request.seed,
            deltas=clip.deltas,
            flow=clip.flow,
            mp4=mp4,
            representation=self.representation_bytes(clip.representation[0]),
            num_frames=int(clip.frames.shape[0]),
            height=int(clip.frames.shape[1]),
            width=int(clip.frames.shape[2]),
            fps=cfg.fps,
            timings=clip.timings,
            safety=safety,
        )

    def check(self, frames: np.ndarray) -> SafetyReport:
        """The detector's report on ``frames`` (T, H, W, 3); with no detector, a report that says so."""
        if self.safety_checker is None:
            return unchecked("this worker's pipeline has no nudity detector")
        return self.safety_checker(frames)

    @torch.no_grad()
    def render(self, request: TurnRequest, on_progress: ProgressFn | None = None) -> Rendered:
        """The turn up to its frames, before the MP4 encoder: what a compute cut is judged on, since H.264 turns a
        change of one level on a few pixels into different encoding decisions across the frame."""
        report = on_progress or (lambda stage, step, total: None)
        cfg = self.config
        timings: dict[str, float] = {}
        deltas, representation = self.think(request, timings, report)

        # 4. Denoise a video latent conditioned on the representation and the motion scope.
        flow = flow_for(deltas.motion)
        with self.decoder_phase(timings), _timed(timings, "denoise"):
            latents = self.denoise(representation, flow, request.seed, report)  # (1, F, C, h, w)

        # 5. Decode to pixels.
        report(Stage.VAE, 0, 1)
        with _timed(timings, "vae"):
            frames = decode_latents(self.vae, latents.to(self.decoder_dtype), cfg.vae.scaling_factor)[0]  # (T, H, W, 3)
        return Rendered(deltas, flow, representation, frames, timings)

    @torch.no_grad()
    def think(
        self, request: TurnRequest, timings: dict[str, float] | None = None, report: ProgressFn | None = None
    ) -> tuple[StateDeltas, torch.Tensor]:
        """The MLLM's half of a turn: the state changes and the representation ``(1, 226, H_dit)``."""
        report = report or (lambda stage, step, total: None)
        timings = {} if timings is None else timings

        # 1. Check inputs before any model work.
        history = [
            self._read_representation(inline(turn.representation, "a history turn's representation"))
            for turn in request.history
        ]

        # 2. Prompt: past turns, then the current one ending at <ML>.
        with _timed(timings, "prompt"):
            prompt = build_prompt(self.tokenizer, request.instruction, request.history, self.config.num_query_tokens)

        # 3. MLLM: four constrained forwards for the state tokens, one for the representation.
        report(Stage.MLLM, 0, 2)
        with self.mllm_phase(timings):
            with _timed(timings, "state_pass"):
                embeds = self.mllm.embed_prompt(prompt, history)  # (1, T, H_llm)
                deltas, _ = self.mllm.predict_states(embeds, self.tokenizer)
            report(Stage.MLLM, 1, 2)
            with _timed(timings, "representation_pass"):
                representation = self.mllm.predict_representation(embeds, prompt)  # (1, 226, H_dit)
        report(Stage.MLLM, 2, 2)
        return deltas, representation

    def denoise(self, representation: torch.Tensor, flow: float, seed: int, report: ProgressFn) -> torch.Tensor:
        """DPM-Solver++(2M) SDE with dynamic CFG; the CFG pair runs as one batch of two."""
        cfg = self.config
        sampler = DPMSolverSDESampler(cfg.sampler)
        num_steps = cfg.sampler.num_steps
        generator = torch.Generator("cpu").manual_seed(seed)
        shape = (1, cfg.latent_frames, cfg.decoder.latent_channels, cfg.latent_height, cfg.latent_width)
        noise = torch.randn(shape, generator=generator).to(self.device)  # drawn on the CPU: same clip on any device

        # The unconditional half is a constant of the decoder; the conditional half is the MLLM's output.
        conditional = representation.to(self.device, self.decoder_dtype)
        condition = torch.cat([self.decoder.unconditional_tokens(1), conditional])  # (2, 226, D)
        flow_pair = torch.full((2,), flow, device=self.device)
        cache = StepCache(cfg.sampler.step_cache_below) if cfg.sampler.step_cache_below else None

        def predict_v(x: torch.Tensor, timestep: int, step_index: int) -> torch.Tensor:
            if sampler.skips_unconditional(step_index):
                t = torch.full((1,), timestep, device=self.device)
                return self.decoder(x.to(self.decoder_dtype), t, conditional, flow_pair[:1], cache).float()
            w = sampler.guidance(step_index)
            pair = torch.cat([x, x]).to(self.decoder_dtype)  # (2, F, C, h, w)
            t = torch.full((2,), timestep, device=self.device)
            v_uncond, v_cond = self.decoder(pair, t, condition, flow_pair, cache).float().chunk(2)
            return v_uncond + w * (v_cond - v_uncond)

        report(Stage.DENOISE, 0, num_steps)

        def step_done(i: int, n: int) -> None:
            report(Stage.DENOISE, i + 1, n)

        latents = sampler.sample(predict_v, noise.float(), generator, callback=step_done)
        self.steps_reused = cache.reused if cache is not None else 0
        return latents

    def _read_representation(self, data: bytes) -> torch.Tensor:
        """Any stored dtype: turns recorded before representations were float16 hold float32."""
        cfg = self.config
        expected = (cfg.num_query_tokens, cfg.decoder.hidden_size)
        try:
            tensor = load_safetensors(data)[REPRESENTATION_KEY]
        except Exception as exc:
            raise ValueError(f"A history turn's representation is not readable safetensors: {exc}") from exc
        if tuple(tensor.shape) != expected:
            raise ValueError(f"A history turn's representation has shape {tuple(tensor.shape)}; expected {expected}.")
        return tensor.to(self.mllm.device, self.mllm_dtype)

    @property
    def placement(self) -> Placement:
        return Placement(offload_mllm=self.offload_mllm, offload_decoder=self.offload_decoder)

    @contextmanager
    def mllm_phase(self, timings: dict[str, float] | None = None) -> Iterator[None]:
        """The state and representation passes: this character's MLLM on the GPU (memory.py plans by this)."""
        if self.shared is not None:
            self.shared.use(self.character)
        with self._on_device(self.mllm, self.offload_mllm, "mllm_to_gpu", timings):
            yield

    @contextmanager
    def decoder_phase(self, timings: dict[str, float] | None = None) -> Iterator[None]:
        """Denoising: this character's decoder on the GPU (memory.py plans by this)."""
        with self._on_device(self.decoder, self.offload_decoder, "decoder_to_gpu", timings):
            yield

    @contextmanager
    def _on_device(
        self, module: torch.nn.Module, offloaded: bool, stage: str, timings: dict[str, float] | None
    ) -> Iterator[None]:
        with ExitStack() as stack:
            if offloaded:
                with _timed(timings if timings is not None else {}, stage):  # the copy to the GPU
                    stack.enter_context(visiting(module, self.device))
            yield

    @staticmethod
    def representation_bytes(representation: torch.Tensor) -> bytes:
        # float16 halves what travels back to the bot and into its database (868 KB at 226 x 1920). Measured
        # on the toy model (benchmarks/representation_precision.py), a float16 representation changes its clip
        # by at most 1 of 255 on a few pixels (PSNR above 70 dB), ~1/10,000 of what a reroll changes, and the
        # next turn's clip less; the published decoder runs in bfloat16, coarser still. Only values beyond
        # float16's range would be lost, so those keep float32.
        half = representation.to(torch.float16)
        if not torch.isfinite(half).all() and torch.isfinite(representation).all():
            largest = float(representation.abs().max())
            log.warning("representation exceeds float16's range (max |x| %.3g); kept as float32", largest)
            half = representation.float()
        return save_safetensors({REPRESENTATION_KEY: half.cpu().contiguous()})


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PipelineLoadError(f"ANIMEGAMER_DEVICE={device} but no CUDA GPU is visible. Use cpu or auto.")
    return device


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - started
