"""`animegamer train plan`: the memory each training phase needs per GPU, counted before any GPU is rented.

Each phase's modules are built at the chosen sizes on the ``meta`` device (shapes, no storage), with the adapters
injected by peft as the phases train them, and one training forward is run under
``torch.autograd.graph.saved_tensors_hooks``: what autograd keeps for the backward pass is the activation memory.
Attention is counted as a fused kernel keeps it (query, key, value, output and the log-sum-exp; flash or
memory-efficient attention on a GPU), not as the meta device's unfused path, whose score matrix alone would be
5.8 GB a decoder layer. With gradient checkpointing every block keeps only its inputs, and one block at a time is
recomputed during the backward pass: activations = what is saved outside the blocks + every block's inputs +
the largest block's own.

What each phase trains, at the published sizes (ANIMEGAMER.md; docs/own-character.md):

- (a) the decoder adapted to the representation: LoRA r=64 on the attention's q, k, v and output projections of
  every decoder block (as the release's SAT layers hold it), the motion-scope embedding, and the clip encoder's
  trained part: the text and image projections (4096 -> 1920 and 768 -> 1920, with their norms) that turn the
  clip's frozen T5 and OpenCLIP features into the 226-token representation. The frozen encoders (T5, OpenCLIP, the
  VAE's encoder) run once over the data set before training: features and latents are read from disk.
- (b) the MLLM: LoRA r=32 on q, k, v, o, gate, up, down of every layer, its RMSNorms, the input and output
  embeddings (in full, as the release trains them: the added tokens' rows are the ones that matter), and both
  resamplers; one sample is a history window of turns.
- (c) the decoder again, on the MLLM's own predicted representations (made once by phase (b)'s model): its LoRA and
  the motion-scope embedding.

Bytes: frozen weights bf16 (2 B); trained weights fp32 master copies (4 B), their gradients fp32 (4 B) and AdamW's
two moments (8 B); activations in bf16 as autocast runs them. DDP replicates everything on each GPU and keeps a
second copy of the gradients in its buckets; FSDP (full shard) divides weights, gradients and optimizer state by
the number of GPUs and gathers one block's weights at a time. A fixed reserve stands for the CUDA context, the
communication buffers and the allocator's fragmentation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from game.contract import HistoryTurn
from game.state import StateDeltas
from training.character_decoder import trainable_decoder
from training.character_phase_b import trainable
from worker.pipeline.config import PipelineConfig
from worker.pipeline.mllm import frame_attention_mask
from worker.pipeline.prompt import build_prompt

PHASES = ("a", "b", "c")
GIB = 1024**3
RESERVE_BYTES = int(2.5 * GIB)  # CUDA context (~0.5 GiB), NCCL buffers, allocator fragmentation
META: dict[str, Any] = {"device": "meta", "dtype": torch.bfloat16}
PLAN_LINE = "Character: Mika; Motion: quickly run; Background: day beach."


@dataclass(frozen=True)
class PhaseModel:
    """One phase's weights and one sample's activations, counted once at the chosen sizes."""

    phase: str
    trained: int  # parameters
    frozen: int
    largest_block: int  # parameters of the largest block FSDP gathers at once
    activations: int  # bytes one sample keeps for the backward pass, with gradient checkpointing
    activations_unchecked: int  # the same without checkpointing
    sequence: int  # tokens a sample runs through the phase's transformer


@dataclass(frozen=True)
class Plan:
    """Memory per GPU for one phase at a batch and GPU count."""

    model: PhaseModel
    gpus: int
    batch: int  # the global batch: samples per optimizer step
    sharding: str  # "ddp" or "fsdp"
    clips: int

    @property
    def per_gpu_batch(self) -> int:
        return math.ceil(self.batch / self.gpus)

    @property
    def shards(self) -> int:
        return self.gpus if self.sharding == "fsdp" else 1

    @property
    def weights(self) -> int:
        gathered = self.model.largest_block * 2 if self.sharding == "fsdp" and self.gpus > 1 else 0
        return (self.model.frozen * 2 + self.model.trained * 4) // self.shards + gathered

    @property
    def gradients(self) -> int:
        buckets = 2 if self.sharding == "ddp" and self.gpus > 1 else 1
        return self.model.trained * 4 * buckets // self.shards

    @property
    def optimizer(self) -> int:
        return self.model.trained * 8 // self.shards

    @property
    def activations(self) -> int:
        return self.model.activations * self.per_gpu_batch

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + RESERVE_BYTES

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.clips / self.batch)

    def fits(self, gpu_gib: float) -> bool:
        return self.total <= gpu_gib * GIB


# ---------------------------------------------------------------------------------------------------------------
# Counting what autograd keeps


class _FusedAttention(torch.autograd.Function):
    """Attention as a fused kernel keeps it for the backward pass: q, k, v, the output and the log-sum-exp, never
    the score matrix. Only ever run on the meta device, for counting."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None):
        out = query.new_empty((*query.shape[:-1], value.shape[-1]))
        lse = query.new_empty(query.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(query, key, value, out, lse)  # a mask is one tensor every layer shares: not counted
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, ...]:  # never run: counting only
        raise NotImplementedError


def _fused_sdpa(query, key, value, attn_mask=None, *args: Any, **kwargs: Any) -> torch.Tensor:
    if query.device.type != "meta":
        raise RuntimeError("the planner's attention stand-in runs on the meta device only")
    if key.shape[-3] != query.shape[-3]:  # grouped-query attention: each key head serves several query heads
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    return _FusedAttention.apply(query, key, value, attn_mask)


@contextmanager
def _fused_attention() -> Iterator[None]:
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, tuple | list):
        return sum(_nbytes(item) for item in value)
    return 0


def saved_bytes(
    run: Callable[[], object], blocks: list[nn.Module], weights: Iterable[torch.Tensor] = (), fused: bool = True
) -> tuple[int, int]:
    """(bytes kept without checkpointing, bytes kept with each of ``blocks`` checkpointed) by one call of ``run``.

    A weight autograd keeps (a linear layer keeps its weight to pass the gradient back) is memory the model holds
    already: tensors that are ``weights`` or views of them are not counted."""
    kept = [0]
    inside: list[int] = []
    inputs: list[int] = []
    handles = []
    held = {id(weight) for weight in weights}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in held and id(tensor._base) not in held:
            kept[0] += tensor.numel() * tensor.element_size()
        return tensor

    for block in blocks:

        def before(module: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs.append(_nbytes(args) + _nbytes(tuple(kwargs.values())))
            inside.append(-kept[0])

        def after(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            inside[-1] += kept[0]

        handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(block.register_forward_hook(after, with_kwargs=True))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            if fused:
                with _fused_attention():
                    run()
            else:
                run()
    finally:
        for handle in handles:
            handle.remove()
    checkpointed = kept[0] - sum(inside) + sum(inputs) + max(inside, default=0)
    return kept[0], checkpointed


# ---------------------------------------------------------------------------------------------------------------
# The phases' modules and one sample each


def _counts(modules: list[nn.Module]) -> tuple[int, int]:
    trained = frozen = 0
    for module in modules:
        for parameter in module.parameters():
            if parameter.requires_grad:
                trained += parameter.numel()
            else:
                frozen += parameter.numel()
    return trained, frozen


def _largest(blocks: list[nn.Module]) -> int:
    return max(sum(p.numel() for p in block.parameters()) for block in blocks)


def decoder_phase(config: PipelineConfig, phase: str) -> PhaseModel:
    """Phase (a) or (c): the decoder with its LoRA, one sample of 17 frames' latents at the config's size."""
    decoder = trainable_decoder(_meta_pipeline(config).decoder, phase, checkpointing=False)  # counted, not run
    cfg, dec = config, config.decoder
    meta = META
    latents = torch.empty(1, cfg.latent_frames, dec.latent_channels, cfg.latent_height, cfg.latent_width, **meta)
    timestep = torch.empty(1, device="meta")

    def run() -> None:
        if phase == "a":  # the representation from the clip's frozen features, through the trained projections
            text = torch.empty(1, dec.num_text_tokens, dec.text_embed_dim, **meta)
            image = torch.empty(1, dec.num_ip_tokens, dec.ip_embed_dim, **meta)
            condition = torch.cat(
                [decoder.text_norm(decoder.text_proj(text)), decoder.ip_norm(decoder.ip_proj(image))], dim=1
            )
        else:  # the MLLM's predicted representation, read from disk
            condition = torch.empty(1, cfg.num_query_tokens, dec.hidden_size, **meta)
        v = decoder(latents, timestep, condition, timestep)
        F.mse_loss(v.float(), torch.empty_like(v, dtype=torch.float32))

    blocks = list(decoder.transformer_blocks)
    unchecked, checked = saved_bytes(run, blocks, decoder.parameters())
    trained, frozen = _counts([decoder])
    tokens = cfg.num_query_tokens + cfg.latent_frames * (cfg.latent_height // dec.patch_size) * (
        cfg.latent_width // dec.patch_size
    )
    return PhaseModel(phase, trained, frozen, _largest(blocks), checked, unchecked, tokens)


def mllm_phase(config: PipelineConfig, history: int) -> PhaseModel:
    """Phase (b): the MLLM with its LoRA, one sample a window of ``history`` turns (the last one predicted)."""
    pipe = _meta_pipeline(config)
    mllm, llm = pipe.mllm, pipe.mllm.llm
    trainable(mllm, checkpointing=False)  # counted by saved_bytes, not run
    zero = StateDeltas(motion=0, social=0, entertainment=0, stamina=0)
    past = [HistoryTurn(instruction=PLAN_LINE, representation=b"", deltas=zero) for _ in range(history - 1)]
    prompt = build_prompt(pipe.tokenizer, PLAN_LINE, past, config.num_query_tokens)
    state_tokens = 10  # <Strength_ML></ML><SC>...</ST>: the targets after the prompt's <ML> (ANIMEGAMER.md)
    length = len(prompt.ids) + state_tokens
    rep_shape = (config.num_query_tokens, config.decoder.hidden_size)

    def run() -> None:
        embeds = llm.get_input_embeddings()(torch.zeros(1, length, dtype=torch.long, device="meta"))
        spans = prompt.history_frame_spans
        pieces, at = [], 0
        for start, end in spans:  # each past turn's representation through the input resampler
            pieces += [embeds[:, at:start], mllm.input_resampler(torch.empty(1, *rep_shape, **META))]
            at = end
        embeds = torch.cat([*pieces, embeds[:, at:]], dim=1) if spans else embeds
        mask = frame_attention_mask(length, prompt.frame_spans, torch.bfloat16, torch.device("meta"))
        out = llm.model(inputs_embeds=embeds, attention_mask=mask, use_cache=False).last_hidden_state  # (1, S, hidden)
        predicted = mllm.output_resampler(out[:, -config.num_query_tokens - state_tokens : -state_tokens])
        F.mse_loss(predicted.float(), torch.empty(1, *rep_shape, device="meta"))
        logits = llm.lm_head(out[:, -state_tokens - 1 : -1])  # the state tokens' logits only
        F.cross_entropy(logits.float().flatten(0, 1), torch.zeros(state_tokens, dtype=torch.long, device="meta"))

    blocks = list(llm.model.layers)
    unchecked, checked = saved_bytes(run, blocks, mllm.parameters())
    trained, frozen = _counts([mllm])
    return PhaseModel("b", trained, frozen, _largest(blocks), checked, unchecked, length)


def _meta_pipeline(config: PipelineConfig) -> Any:
    from worker.pipeline.pipeline import AnimeGamerPipeline

    return AnimeGamerPipeline.random_weights(config, "meta", mllm_dtype=torch.bfloat16, decoder_dtype=torch.bfloat16)


def phase_model(config: PipelineConfig, phase: str, history: int = 5) -> PhaseModel:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    return mllm_phase(config, history) if phase == "b" else decoder_phase(config, phase)


def gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def table(
    config: PipelineConfig, batch: int, gpus: list[int], gpu_gib: list[float], sharding: str, history: int, clips: int
) -> str:
    """The plan as a Markdown table: one row per phase and GPU count, which GPU sizes it fits."""
    head = (
        f"Training plan at the {config.name} sizes: global batch {batch}, history windows of {history} turns, "
        f"{clips} clips, gradient checkpointing, AdamW, bf16 autocast; GiB per GPU (reserve {gib(RESERVE_BYTES)} "
        "for the CUDA context, communication and fragmentation)\n"
    )
    rows = [
        "| phase | GPUs | sharding | trained / frozen params | weights | grads | optimizer | activations "
        "(per sample) | total | fits | steps per epoch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for phase in PHASES:
        model = phase_model(config, phase, history)
        for count in gpus:
            mode = sharding if sharding != "auto" else ("ddp" if count == 1 else "fsdp")
            plan = Plan(model, count, batch, mode, clips)
            fits = ", ".join(f"{size:g} GB" for size in gpu_gib if plan.fits(size)) or "none listed"
            rows.append(
                f"| {phase} | {count} | {mode} | {model.trained / 1e6:.1f} M / {model.frozen / 1e9:.2f} B "
                f"| {gib(plan.weights)} | {gib(plan.gradients)} | {gib(plan.optimizer)} "
                f"| {gib(plan.activations)} ({gib(model.activations)}) | **{gib(plan.total)}** | {fits} "
                f"| {plan.steps_per_epoch} |"
            )
    return head + "\n" + "\n".join(rows)
