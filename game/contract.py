"""The job contract between the bot (or the CLI) and the GPU workers.

Workers are stateless: everything a turn needs travels in a ``TurnRequest`` and everything it
produces comes back in a ``TurnResult``. Both cross a Celery queue as JSON (bytes as base64),
carry ``version`` so a bot and a worker from different releases refuse each other clearly,
and hold plain data only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from game.history import MAX_WINDOW
from game.instruction import parse
from game.state import StateDeltas

CONTRACT_VERSION = 1
TASK_NAME = "animegamer.generate_turn"

# The label every place that shows a tiny-model clip must carry.
RANDOM_WEIGHTS_LABEL = "tiny model, random weights"
TOY_LABEL = "toy model, trained on the toy world"  # worker.pipeline.toy: drawn clips, not anime

_WIRE = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64", extra="forbid")


class _Versioned(BaseModel):
    model_config = _WIRE

    version: Literal[1] = CONTRACT_VERSION


class HistoryTurn(BaseModel):
    """A past turn as the prompt needs it: its instruction, representation and states."""

    model_config = _WIRE

    instruction: str
    representation: bytes = Field(description="safetensors bytes holding 'representation' [226, D]")
    deltas: StateDeltas


class TurnRequest(_Versioned):
    job_id: str = Field(min_length=1, max_length=64)
    instruction: str = Field(description="one canonical instruction line")
    seed: int = Field(ge=0, lt=2**63)
    history: list[HistoryTurn] = Field(default_factory=list, max_length=MAX_WINDOW - 1)

    @field_validator("instruction")
    @classmethod
    def _canonical(cls, value: str) -> str:
        return str(parse(value))


class TurnResult(_Versioned):
    job_id: str
    model: str = Field(description="the model that made the clip, e.g. 'tiny'")
    label: str = Field(description="what a viewer must be told about the model, '' for trained weights")
    seed: int
    deltas: StateDeltas
    flow: float
    mp4: bytes
    representation: bytes
    num_frames: int
    height: int
    width: int
    fps: int
    timings: dict[str, float] = Field(default_factory=dict, description="seconds per stage")
