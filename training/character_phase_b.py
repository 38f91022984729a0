"""Phase (b) for the published architecture: the MLLM learns a character's representations and state changes.

What trains (``training.plan`` counts the same): peft's LoRA (``MLLM_LORA``: r=32 on q, k, v, o, gate, up, down),
the RMSNorms, both resamplers, and the embeddings (the added tokens' rows are the ones that matter; the release
trains both embedding matrices in full, and its file holds them so). The Mistral base stays frozen, so a trained
character is served on the one shared base (``training.release_export``).

One sample is a window of 1..5 turns of an episode, the release's history: the prompt holds the earlier turns
with their instructions, state changes and representations (through the input resampler), then the current turn
up to ``<ML>``, then its answer ``<Strength_ML></ML><SC>...<Strength_ST></ST>``. Two losses, as the release's
model is trained (paper, section 3): the representation read at the prompt's last N positions (where inference
reads it, ``AnimeGamerMLLM.predict_representation``) regressed onto the target by MSE, and next-token
cross-entropy on the answer's tokens. Samples differ in length, so each runs alone and a batch is their mean.

The targets are the clip encoder's representations of each clip (phase (a)), given as a tensor per clip; the run
loop is the one every phase shares (``training.loop``: accelerate, resumable, losses logged per step).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from peft import LoraConfig, inject_adapter_in_model
from torch import nn

from game.contract import HistoryTurn
from game.state import StateDeltas
from training.dataset import EPISODES, MAX_TURNS
from worker.pipeline.mllm import STATE_TAGS, AnimeGamerMLLM, frame_attention_mask
from worker.pipeline.prompt import build_prompt
from worker.pipeline.tokenizer import STRENGTH_MIN, AnimeGamerTokenizer

CLOSING = ("</ML>", "</SC>", "</ET>", "</ST>")
# The release's mistral-7b.yaml: r 32, alpha 32, dropout 0.05 on every projection of every layer
MLLM_LORA = LoraConfig(
    r=32,
    lora_alpha=32,
    lora_dropout=0.05,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)


@dataclass(frozen=True)
class Turn:
    instruction: str
    deltas: StateDeltas
    representation: torch.Tensor  # (N, D): the clip encoder's representation of this turn's clip


def answer_ids(tokenizer: AnimeGamerTokenizer, deltas: StateDeltas) -> list[int]:
    """The state answer after the prompt's ``<ML>``: ``<Strength_ML></ML><SC><Strength_SC></SC>...</ST>``."""
    values = (deltas.motion, deltas.social, deltas.entertainment, deltas.stamina)
    ids: list[int] = []
    for slot, value in enumerate(values):
        if slot:
            ids.append(tokenizer.token_id(STATE_TAGS[slot]))
        ids += [tokenizer.strength_ids[value - STRENGTH_MIN], tokenizer.token_id(CLOSING[slot])]
    return ids


def windows_from(data: Path, representations: Mapping[str, torch.Tensor]) -> list[list[Turn]]:
    """Every turn of a prepared data set (``animegamer data prepare``) with the turns before it in its episode (at
    most ``MAX_TURNS`` in all), as phase (b)'s samples. ``representations`` maps ``"<episode id>/<turn>"`` to the
    clip encoder's representation of that clip (phase (a)'s output); a missing one is named."""
    return list(keyed_windows(data, representations).values())


def keyed_windows(data: Path, representations: Mapping[str, torch.Tensor]) -> dict[str, list[Turn]]:
    """``windows_from``'s windows under the key of their last turn, ``"<episode id>/<turn>"``."""
    made: dict[str, list[Turn]] = {}
    for line in (Path(data) / EPISODES).read_text().splitlines():
        episode = json.loads(line)
        turns = []
        for index, record in enumerate(episode["turns"]):
            key = f"{episode['id']}/{index}"
            if key not in representations:
                raise KeyError(f"no representation for {key} (phase (a) writes one for every clip)")
            deltas = StateDeltas(**record["deltas"])
            turns.append(Turn(record["instruction"], deltas, representations[key]))
            made[key] = turns[max(0, len(turns) - MAX_TURNS) :]
    return made


class RepresentationAndStates(nn.Module):
    """The MLLM with the loss of phase (b); ``forward(batch, generator)`` as ``training.loop`` calls it."""

    def __init__(self, mllm: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, regression_weight: float = 1.0) -> None:
        super().__init__()
        self.mllm = mllm
        self.tokenizer = tokenizer
        self.regression_weight = regression_weight

    def losses(self, window: Sequence[Turn]) -> tuple[torch.Tensor, torch.Tensor]:
        """(representation MSE, answer cross-entropy) of the window's last turn, its earlier turns as history."""
        predicted, logits, answer = self._forward(window)
        target = window[-1].representation.to(predicted.device, predicted.dtype)[None]
        regression = F.mse_loss(predicted.float(), target.float())
        states = F.cross_entropy(logits.float().flatten(0, 1), answer.flatten())
        return regression, states

    @torch.no_grad()
    def predict(self, window: Sequence[Turn]) -> torch.Tensor:
        """The representation ``(N, D)`` the model predicts for the window's last turn: phase (c)'s condition."""
        return self._forward(window)[0][0].float()

    def _forward(self, window: Sequence[Turn]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(predicted representation (1, N, D), answer logits (1, A, V), answer ids (1, A)) of the last turn."""
        mllm, n = self.mllm, self.mllm.num_query_tokens
        *past, now = window
        history = [HistoryTurn(instruction=t.instruction, representation=b"", deltas=t.deltas) for t in past]
        prompt = build_prompt(self.tokenizer, now.instruction, history, n)
        embeds = mllm.embed_prompt(prompt, [t.representation for t in past])  # (1, P, H)
        answer = torch.tensor([answer_ids(self.tokenizer, now.deltas)], device=mllm.device)  # (1, A)
        embeds = torch.cat([embeds, mllm.llm.get_input_embeddings()(answer)], dim=1)  # (1, P + A, H)
        length, prompt_length = embeds.shape[1], len(prompt.ids)
        mask = frame_attention_mask(length, prompt.frame_spans, embeds.dtype, embeds.device)
        hidden = mllm.llm.model(inputs_embeds=embeds, attention_mask=mask, use_cache=False).last_hidden_state
        predicted = mllm.output_resampler(hidden[:, prompt_length - n : prompt_length])  # (1, N, D)
        logits = mllm.llm.lm_head(hidden[:, prompt_length - 1 : length - 1])  # each answer token from the one before
        return predicted, logits, answer

    def forward(self, batch: Sequence[Sequence[Turn]], generator: torch.Generator | None = None) -> torch.Tensor:
        total = torch.zeros((), device=self.mllm.device)
        for window in batch:
            regression, states = self.losses(window)
            total = total + self.regression_weight * regression + states
        return total / len(batch)


def trainable(mllm: AnimeGamerMLLM, checkpointing: bool = True) -> None:
    """peft's LoRA into the llm, and what else phase (b) trains; everything else frozen. With ``checkpointing``
    each layer keeps only its inputs for the backward pass while training (what ``training.plan`` counts)."""
    inject_adapter_in_model(MLLM_LORA, mllm.llm)
    if checkpointing:
        mllm.llm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for name, param in mllm.named_parameters():
        param.requires_grad_(
            "lora_" in name or "norm" in name or "resampler" in name or "embed_tokens" in name or "lm_head" in name
        )
