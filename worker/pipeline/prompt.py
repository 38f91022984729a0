"""The MLLM prompt for one turn, built id by id.

Layout (ANIMEGAMER.md, "MLLM prompt for the current turn"):

    <s>
    per past turn, oldest first:
        <TURN> instruction <img><frame> <frame_00000>..<frame_{N-1}> </frame></img>
        <ML><Strength_a></ML><SC><Strength_b></SC><ET><Strength_c></ET><ST><Strength_d></ST></ST></TURN>
    the current turn:
        <TURN> instruction <img><frame> <frame_00000>..<frame_{N-1}> </frame></img><ML>

``</ST>`` really appears twice in a past turn: the model was trained on the release's prompts.
Building from ids, not from a string holding token names, means an instruction can never smuggle
in a special token and no tokenizer quirk can shift the frame spans.

The release (inference_MLLM.py, app.py) writes the same layout as three strings per turn,
``"<TURN>" + instruction``, ``"<img><frame><frame_00000>...</frame></img>"`` and the state string
(``"<ML>"`` alone for the current turn), encodes each with ``add_special_tokens=False`` and
concatenates the ids after ``[bos_token_id]``; no spaces are written anywhere. Every string starts
with an added token, so the ids equal ours as long as the instruction is encoded the way text after
an added token is (``SentencePieceBase.encode``): 254 ids for the first demo line.
Its history loop never runs (``max_window = 1``), and where it would, it writes the CURRENT turn's
states into every past turn (``character_states[gen_turn_id]``); we write each past turn's own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from game.contract import HistoryTurn
from game.state import StateDeltas
from worker.pipeline.config import NUM_FRAME_TOKENS, NUM_QUERY_TOKENS
from worker.pipeline.tokenizer import AnimeGamerTokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    """Token ids and, per turn, the half-open ``[start, end)`` span of its frame tokens.

    ``frame_spans`` lists past turns first and the current turn last; the MLLM replaces the past
    spans' embeddings with their representations and attends bidirectionally inside every span.
    """

    ids: list[int]
    frame_spans: list[tuple[int, int]]

    @property
    def current_frame_span(self) -> tuple[int, int]:
        return self.frame_spans[-1]

    @property
    def history_frame_spans(self) -> list[tuple[int, int]]:
        return self.frame_spans[:-1]


def _video_block(tokenizer: AnimeGamerTokenizer, num_query_tokens: int) -> tuple[list[int], int]:
    """``<img><frame>`` + frame tokens + ``</frame></img>``, and the frame tokens' offset inside it."""
    t = tokenizer.token_id
    frames = [tokenizer.frame_id(i) for i in range(num_query_tokens)]
    return [t("<img>"), t("<frame>"), *frames, t("</frame>"), t("</img>")], 2


def state_block(tokenizer: AnimeGamerTokenizer, deltas: StateDeltas) -> list[int]:
    """A past turn's closing ids, from ``<ML>`` to ``</TURN>``; training appends its first 11 to a prompt."""
    t, s = tokenizer.token_id, tokenizer.strength_id
    return [
        t("<ML>"), s(deltas.motion), t("</ML>"),
        t("<SC>"), s(deltas.social), t("</SC>"),
        t("<ET>"), s(deltas.entertainment), t("</ET>"),
        t("<ST>"), s(deltas.stamina), t("</ST>"), t("</ST>"),  # the release's doubled </ST>
        t("</TURN>"),
    ]  # fmt: skip


def build_prompt(
    tokenizer: AnimeGamerTokenizer,
    instruction: str,
    history: Sequence[HistoryTurn],
    num_query_tokens: int = NUM_QUERY_TOKENS,
) -> Prompt:
    """The prompt both MLLM passes read: history turns with their states, then the current turn up to ``<ML>``."""
    if not 0 < num_query_tokens <= NUM_FRAME_TOKENS:
        raise ValueError(f"num_query_tokens must be 1..{NUM_FRAME_TOKENS}, got {num_query_tokens}")
    video, frame_offset = _video_block(tokenizer, num_query_tokens)

    ids = [tokenizer.bos_id]
    spans: list[tuple[int, int]] = []

    def add_turn(text: str) -> None:
        # The text directly follows <TURN>, which is exactly the context ``encode`` reproduces.
        ids.extend([tokenizer.token_id("<TURN>"), *tokenizer.encode(text)])
        start = len(ids) + frame_offset
        spans.append((start, start + num_query_tokens))
        ids.extend(video)

    # 1. Past turns, oldest first, each closed by the states it produced
    for turn in history:
        add_turn(turn.instruction)
        ids.extend(state_block(tokenizer, turn.deltas))

    # 2. The current turn, left open at <ML> for the state pass to continue
    add_turn(instruction)
    ids.append(tokenizer.token_id("<ML>"))
    return Prompt(ids=ids, frame_spans=spans)
