"""The AnimeGamer MLLM: Mistral plus two resamplers, and its two passes over one prompt.

The state pass reads four Strength tokens after the prompt's ``<ML>``; the representation pass
reads the final hidden states the decoder is conditioned on (ANIMEGAMER.md, "The two MLLM
passes"). Attribute names ``llm``, ``input_resampler`` and ``output_resampler`` follow the
release's wrapper so its state dict maps onto this module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache, MistralConfig, MistralForCausalLM

from game.state import StateDeltas
from worker.pipeline.config import NUM_QUERY_TOKENS, MLLMConfig
from worker.pipeline.prompt import Prompt
from worker.pipeline.tokenizer import STRENGTH_MIN, AnimeGamerTokenizer

logger = logging.getLogger(__name__)

# Each state is opened by a tag and its Strength is followed by the closing tag; the state pass
# forces the two structural tokens after each Strength (closing tag, next opening tag).
STATE_TAGS = ("<ML>", "<SC>", "<ET>", "<ST>")  # motion, social, entertainment, stamina
_FORCED_AFTER = (("</ML>", "<SC>"), ("</SC>", "<ET>"), ("</ET>", "<ST>"))

# The release's state pass is transformers' greedy generate with its AutoVideoTokenGenerationProcessor
# (TencentARC/AnimeGamer MLLM/src/models_clm/generation.py), which ContinuousLVLM_Video.generate
# (MLLM/src/models_clm/models.py) builds with num_vid_gen_tokens=100; app.py and inference_MLLM.py keep that default.
RELEASE_PROCESSOR_FRAMES = 100


def state_step_tokens(slot: int) -> int:
    """Tokens the state pass feeds after choosing the Strength of state ``slot``: it and the tags that follow."""
    return 1 + len(_FORCED_AFTER[slot])


def frame_attention_mask(
    seq_len: int, spans: Sequence[tuple[int, int]], dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """Additive mask [1, 1, T, T]: causal, except each frame span sees all of itself.

    Additive (0 / dtype min) rather than boolean so the same mask means the same thing to every
    attention implementation: sdpa takes it as-is and eager adds it to the scores.
    """
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()  # [T, T], query x key
    for start, end in spans:
        if not 0 <= start < end <= seq_len:
            raise ValueError(f"frame span [{start}, {end}) does not fit a sequence of {seq_len} tokens")
        allowed[start:end, start:end] = True
    mask = torch.zeros(seq_len, seq_len, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]  # [1, 1, T, T]


def parse_states(ids: Sequence[int], tokenizer: AnimeGamerTokenizer) -> StateDeltas | None:
    """The Strength right after the first ``<ML>``, ``<SC>``, ``<ET>`` and ``<ST>``; None if any is missing."""
    values: list[int] = []
    for tag in STATE_TAGS:
        tag_id = tokenizer.token_id(tag)
        position = next((i for i, token in enumerate(ids) if token == tag_id), None)
        if position is None or position + 1 >= len(ids):
            return None
        value = tokenizer.strength_value(ids[position + 1])
        if value is None:
            return None
        values.append(value)
    motion, social, entertainment, stamina = values
    return StateDeltas(motion=motion, social=social, entertainment=entertainment, stamina=stamina)


def release_processor_ids(tokenizer: AnimeGamerTokenizer) -> list[int]:
    """The release processor's id list: ``<frame>``, ``<frame_00000>``..``<frame_00099>``, ``</frame>`` (102 ids).

    The release encodes the concatenated names; the slow Llama tokenizer splits them into exactly these ids.
    """
    frames = [tokenizer.frame_id(i) for i in range(RELEASE_PROCESSOR_FRAMES)]
    return [tokenizer.token_id("<frame>"), *frames, tokenizer.token_id("</frame>")]


def apply_release_processor(scores: torch.Tensor, previous: int, processor_ids: Sequence[int]) -> torch.Tensor:
    """The release's logits processor on one step's next-token scores `[V]`, in place; returns `scores`.

    After ``<frame>`` or ``<frame_00000>``..``<frame_00099>`` (the list but its last id) the list's next id is set
    to the highest score plus 10, which greedy decoding then takes: a frame run counts up, and ``<frame_00099>`` is
    followed by ``</frame>``. After anything else the scores of ``<frame_00000>``..``<frame_00099>`` and
    ``</frame>`` are set to 0.0, not minus infinity, so where every other score is negative the model picks
    ``<frame_00000>`` and the run starts. ``<frame>`` and the frame tokens from 100 on are never changed.
    """
    position = processor_ids.index(previous) if previous in processor_ids[:-1] else None
    if position is not None:
        scores[processor_ids[position + 1]] = scores.max() + 10.0
    else:
        scores[torch.tensor(processor_ids[1:], device=scores.device)] = 0.0
    return scores


class AnimeGamerMLLM(nn.Module):
    """Mistral (causal LM) with the release's input and output resamplers.

    Args:
        config (`MLLMConfig`): the LLM's sizes.
        vocab_size (`int`): the tokenizer's size, base vocabulary plus the 284 AnimeGamer tokens.
        representation_dim (`int`): width of a turn's representation (the decoder's hidden size, 1920).
        num_query_tokens (`int`, defaults to 226): rows of a representation, and frame tokens per turn.
    """

    def __init__(
        self,
        config: MLLMConfig,
        vocab_size: int,
        representation_dim: int,
        num_query_tokens: int = NUM_QUERY_TOKENS,
    ) -> None:
        super().__init__()
        if config.hidden_size % config.num_heads:
            raise ValueError(f"hidden_size {config.hidden_size} is not a multiple of num_heads {config.num_heads}")
        if config.num_heads % config.num_kv_heads:
            raise ValueError(f"num_heads {config.num_heads} is not a multiple of num_kv_heads {config.num_kv_heads}")
        if vocab_size <= config.base_vocab_size:
            raise ValueError(f"vocab_size {vocab_size} must exceed the base vocabulary {config.base_vocab_size}")
        self.config = config
        self.representation_dim = representation_dim
        self.num_query_tokens = num_query_tokens

        # 1. The language model; no sliding window: prompts stay far below the window of 4096
        llm_config = MistralConfig(
            vocab_size=vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_kv_heads,
            max_position_embeddings=config.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
            rms_norm_eps=config.rms_norm_eps,
            sliding_window=None,
            tie_word_embeddings=False,
            attn_implementation="sdpa",
        )
        self.llm = MistralForCausalLM(llm_config)

        # 2. Representation -> input embeddings for past turns' frame spans
        hidden = config.hidden_size
        self.input_resampler = nn.Sequential(
            nn.Linear(representation_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden)
        )
        # 3. Final hidden states -> the decoder's condition
        self.output_resampler = nn.Sequential(
            nn.Linear(hidden, representation_dim), nn.GELU(), nn.Linear(representation_dim, representation_dim)
        )

    @property
    def device(self) -> torch.device:
        return self.llm.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.llm.get_input_embeddings().weight.dtype

    @torch.no_grad()
    def embed_prompt(self, prompt: Prompt, history_representations: Sequence[torch.Tensor]) -> torch.Tensor:
        """Token embeddings [1, T, hidden], past turns' frame spans replaced by their resampled representations."""
        spans = prompt.history_frame_spans
        if len(history_representations) != len(spans):
            raise ValueError(
                f"the prompt has {len(spans)} past turns but {len(history_representations)} representations were given"
            )
        expected = (self.num_query_tokens, self.representation_dim)
        for start, end in prompt.frame_spans:
            if end - start != self.num_query_tokens:
                raise ValueError(f"frame span [{start}, {end}) is not {self.num_query_tokens} tokens long")

        ids = torch.tensor(prompt.ids, dtype=torch.long, device=self.device)[None]  # [1, T]
        embeds = self.llm.get_input_embeddings()(ids)  # [1, T, hidden]
        for turn, ((start, end), representation) in enumerate(zip(spans, history_representations, strict=True)):
            if tuple(representation.shape) != expected:
                raise ValueError(
                    f"history representation {turn} has shape {tuple(representation.shape)}, expected {expected}"
                )
            # Stored representations may come back in another dtype (e.g. fp32 from safetensors).
            rep = representation.to(device=self.device, dtype=self.dtype)  # [N, D]
            embeds[0, start:end] = self.input_resampler(rep)  # [N, hidden]
        return embeds

    @torch.no_grad()
    def state_logits(self, inputs_embeds: torch.Tensor, tokenizer: AnimeGamerTokenizer) -> tuple[torch.Tensor, int]:
        """Logits over the 11 Strength ids at the four choice positions [4, 11], and the forward passes made.

        Only the Strength slots are choices; the structural tokens between them are known, so each
        chosen Strength is fed together with the two tokens that follow it, through the KV cache:
        four forwards per turn, and a well-formed answer whatever the weights.
        """
        self._check_embeds(inputs_embeds)
        strength_ids = torch.tensor(tokenizer.strength_ids, device=self.device)  # [11]
        forced = [[tokenizer.token_id(name) for name in pair] for pair in _FORCED_AFTER]

        cache = DynamicCache(config=self.llm.config)
        out = self.llm(inputs_embeds=inputs_embeds, cache=cache, use_cache=True, logits_to_keep=1)
        passes = 1
        rows: list[torch.Tensor] = []
        for slot in range(len(STATE_TAGS)):
            logits = out.logits[0, -1, strength_ids]  # [11]
            rows.append(logits)
            if slot == len(STATE_TAGS) - 1:
                break
            chosen = int(strength_ids[logits.argmax()])
            step = torch.tensor([[chosen, *forced[slot]]], device=self.device)  # [1, 3]
            out = self.llm(input_ids=step, cache=out.cache, use_cache=True, logits_to_keep=1)
            passes += 1
        return torch.stack(rows), passes  # [4, 11]

    @torch.no_grad()
    def predict_states(self, inputs_embeds: torch.Tensor, tokenizer: AnimeGamerTokenizer) -> tuple[StateDeltas, int]:
        """The turn's four state deltas by constrained greedy decoding, and the forward passes made (4)."""
        logits, passes = self.state_logits(inputs_embeds, tokenizer)
        motion, social, entertainment, stamina = (int(i) + STRENGTH_MIN for i in logits.argmax(dim=-1))
        return StateDeltas(motion=motion, social=social, entertainment=entertainment, stamina=stamina), passes

    @torch.no_grad()
    def release_generate(
        self, inputs_embeds: torch.Tensor, tokenizer: AnimeGamerTokenizer, max_new_tokens: int = 200
    ) -> list[int]:
        """The ids the release's state generation yields: greedy, one token per forward, through its processor.

        Stops after EOS or `max_new_tokens` ids. The processor reads the token before the one it scores: for the
        first, the prompt's last, which is always ``<ML>`` (prompt.py), outside the processor's list. Scores are
        processed in float32, as recent transformers' generate does; older ones processed the model's dtype (bf16
        in the release), which picks the same ids unless the top score reaches 4096, where bf16 rounds max + 10
        back to max.
        """
        self._check_embeds(inputs_embeds)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        processor_ids = release_processor_ids(tokenizer)
        previous = tokenizer.token_id("<ML>")
        cache = DynamicCache(config=self.llm.config)
        out = self.llm(inputs_embeds=inputs_embeds, cache=cache, use_cache=True, logits_to_keep=1)
        generated: list[int] = []
        while True:
            scores = out.logits[0, -1].to(dtype=torch.float32, copy=True)  # [V]; the processor writes into it
            scores = apply_release_processor(scores, previous, processor_ids)
            previous = int(scores.argmax())
            generated.append(previous)
            if previous == tokenizer.eos_id or len(generated) >= max_new_tokens:
                return generated
            step = torch.tensor([[previous]], device=self.device)  # [1, 1]
            out = self.llm(input_ids=step, cache=out.cache, use_cache=True, logits_to_keep=1)

    @torch.no_grad()
    def release_state_pass(
        self, inputs_embeds: torch.Tensor, tokenizer: AnimeGamerTokenizer, max_new_tokens: int = 200
    ) -> tuple[StateDeltas, int]:
        """The release's state pass, kept for benchmarks, and the forward passes it made (one per generated id).

        Generation is :meth:`release_generate`. States are read by id from the generated tokens preceded by the
        prompt's final ``<ML>``; when one is missing the release silently returns zeros, and so does this (with a
        warning).
        """
        generated = self.release_generate(inputs_embeds, tokenizer, max_new_tokens)
        deltas = parse_states([tokenizer.token_id("<ML>"), *generated], tokenizer)
        if deltas is None:
            logger.warning("release state pass: no well-formed states in %s; using zeros", tokenizer.decode(generated))
            deltas = StateDeltas(motion=0, social=0, entertainment=0, stamina=0)
        return deltas, len(generated)

    @torch.no_grad()
    def predict_representation(self, inputs_embeds: torch.Tensor, prompt: Prompt) -> torch.Tensor:
        """The decoder's condition [1, N, representation_dim] from one forward over the prompt.

        Frame spans attend bidirectionally within themselves. The LAST N final-layer states are
        taken, as the release does: with the prompt ending ``</frame></img><ML>`` those are
        ``<frame_00003>``..``<frame_00225>``, ``</frame>``, ``</img>``, ``<ML>``, not the frame
        tokens. The decoder was adapted on exactly these, so this is reproduced, not corrected.
        """
        self._check_embeds(inputs_embeds)
        seq_len = inputs_embeds.shape[1]
        if seq_len != len(prompt.ids):
            raise ValueError(f"inputs_embeds has {seq_len} positions but the prompt has {len(prompt.ids)} tokens")
        if seq_len < self.num_query_tokens:
            raise ValueError(f"the prompt has {seq_len} tokens, fewer than the {self.num_query_tokens} to read out")
        mask = frame_attention_mask(seq_len, prompt.frame_spans, inputs_embeds.dtype, inputs_embeds.device)
        # A 4D mask reaches the attention layers unchanged (masking_utils returns it as-is).
        out = self.llm.model(inputs_embeds=inputs_embeds, attention_mask=mask, use_cache=False)
        hidden = out.last_hidden_state[:, -self.num_query_tokens :]  # [1, N, hidden], after the final norm
        return self.output_resampler(hidden)  # [1, N, representation_dim]

    def _check_embeds(self, inputs_embeds: torch.Tensor) -> None:
        hidden = self.config.hidden_size
        if inputs_embeds.ndim != 3 or inputs_embeds.shape[0] != 1 or inputs_embeds.shape[2] != hidden:
            raise ValueError(f"inputs_embeds must be [1, T, {hidden}], got {tuple(inputs_embeds.shape)}")
