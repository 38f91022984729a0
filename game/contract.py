"""The job contract between the bot (or the CLI) and the GPU workers.

Workers are stateless: everything a turn needs travels in a ``TurnRequest`` and everything it
produces comes back in a ``TurnResult``. Both cross a Celery queue as JSON (bytes as base64),
carry ``version`` so a bot and a worker from different releases refuse each other clearly,
and hold plain data only.

Large bytes (clips, representations) never ride the queue: above a size set in settings they
are written to a blob store the bot and the workers both reach (``relay.blob_store``) and the message
carries a ``BlobRef``, their hash and size. Every field that may be large is a ``Blob``: inline
bytes or such a reference. Whoever reads one resolves it first; ``inline`` says so when not.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from game.history import MAX_WINDOW
from game.instruction import parse
from game.safety import SafetyReport
from game.state import StateDeltas

# 2: large bytes may be a BlobRef into the shared blob store; 3: a result carries its safety report; 4: a request
# carries its ticket and a result the proof made with it (game/proof.py)
CONTRACT_VERSION = 4
TASK_NAME = "animegamer.generate_turn"
RESULT_KEEP_SECONDS = 24 * 3600  # a finished turn's result, and its blobs, wait this long for the bot to read them

# The label every place that shows a tiny-model clip must carry.
RANDOM_WEIGHTS_LABEL = "tiny model, random weights"
FULL_RANDOM_WEIGHTS_LABEL = "full-size model, random weights"  # worker.pipeline.config.full
TOY_LABEL = "toy model, trained on the toy world"  # worker.pipeline.toy: drawn clips, not anime


# The state a worker stores while its turn runs, with a ``Progress`` as its meta. Celery's own states (PENDING,
# STARTED, SUCCESS, FAILURE, ...) are read through ``celery.states``; this one is ours, so it is named here once.
PROGRESS_STATE = "PROGRESS"


class Stage(enum.StrEnum):
    """Where a turn is on its worker, in order: what the pipeline reports and what the bot and the CLI show."""

    LOADING = "loading"  # a worker started with --no-preload loads its model on its first turn
    MLLM = "mllm"  # the state pass and the representation pass
    DENOISE = "denoise"  # one report per solver step: the only stage with a meaningful step count
    VAE = "vae"
    SAFETY = "safety"  # the nudity detector over the frames
    ENCODE = "encode"  # frames to MP4


class Progress(BaseModel):
    """A running turn's progress as the worker stores it and the bot reads it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    stage: Stage
    step: int = Field(ge=0)
    total: int = Field(ge=0)

    @classmethod
    def read(cls, meta: object) -> Progress | None:
        """The stored meta as a Progress; None when it is not one (a worker of another release, a store's junk)."""
        try:
            return cls.model_validate(meta)
        except ValidationError:
            return None


ProgressFn = Callable[[Stage, int, int], None]  # (stage, step, total): how a pipeline reports


def is_random_weights(label: str) -> bool:
    """Whether a clip's label says its model was never trained: its clips are noise, and every viewer is told."""
    return "random weights" in label


_WIRE = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64", extra="forbid")


class _Versioned(BaseModel):
    model_config = _WIRE

    version: Literal[4] = CONTRACT_VERSION

    @model_validator(mode="before")
    @classmethod
    def _same_release(cls, data: object) -> object:
        # Checked first, so a bot and a worker of different releases are told that, not which field differs.
        if isinstance(data, dict) and data.get("version", CONTRACT_VERSION) != CONTRACT_VERSION:
            raise ValueError(
                f"a {cls.__name__} of contract version {data['version']} reached a side that speaks version "
                f"{CONTRACT_VERSION}: run the bot and the workers from the same release"
            )
        return data


class BlobRef(BaseModel):
    """Bytes kept in the shared blob store instead of the message: the store finds them by hash and checks both."""

    model_config = _WIRE

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


Blob = bytes | BlobRef  # inline bytes, or a reference the reader resolves through the blob store


class UnresolvedBlob(ValueError):
    """Bytes were needed where a reference still stood: a caller skipped the blob store."""


def inline(blob: Blob, what: str) -> bytes:
    """The bytes of a resolved blob; a reference here is a bug, said with what it was."""
    if isinstance(blob, BlobRef):
        raise UnresolvedBlob(f"{what} is still a blob reference ({blob.sha256[:12]}, {blob.size} B); resolve it first")
    return blob


class HistoryTurn(BaseModel):
    """A past turn as the prompt needs it: its instruction, representation and states."""

    model_config = _WIRE

    instruction: str
    representation: Blob = Field(description="safetensors bytes holding 'representation' [226, D], or a reference")
    deltas: StateDeltas


class TurnRequest(_Versioned):
    job_id: str = Field(min_length=1, max_length=64)
    instruction: str = Field(description="one canonical instruction line")
    seed: int = Field(ge=0, lt=2**63)
    history: list[HistoryTurn] = Field(default_factory=list, max_length=MAX_WINDOW - 1)
    # What the worker given this turn proves its result with (game/proof.py); "" where nobody asks for a proof (the
    # local demo). Not a secret of the game's: one turn's ticket proves nothing about another's.
    ticket: str = Field(default="", repr=False)

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
    mp4: Blob
    representation: Blob = Field(description="safetensors bytes (float16) holding 'representation', or a reference")
    num_frames: int
    height: int
    width: int
    fps: int
    timings: dict[str, float] = Field(default_factory=dict, description="seconds per stage")
    # Required: a worker that ran no detector says so (game.safety.unchecked), and the bot withholds the clip.
    safety: SafetyReport = Field(description="the nudity detector's scores over the clip's frames")
    proof: str = Field(default="", description="HMAC of this result under its request's ticket (game/proof.py)")
