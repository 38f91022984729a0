"""Character state: what a turn changes, and the arithmetic the release uses.

The MLLM predicts four values per turn, each -5..5: motion level (ML), social (SC),
entertainment (ET) and stamina (ST). Motion level drives the decoder; the other three are
kept per character, start at 50, move by 5 x delta and stay within 0..100.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DELTA_MIN, DELTA_MAX = -5, 5
STAT_START, STAT_MIN, STAT_MAX = 50, 0, 100
STAT_STEP = 5  # one unit of predicted change moves a stat by this much

Delta = Field(ge=DELTA_MIN, le=DELTA_MAX)


class StateDeltas(BaseModel):
    """One turn's predicted changes, in the order the model emits them."""

    model_config = ConfigDict(frozen=True)

    motion: int = Delta
    social: int = Delta
    entertainment: int = Delta
    stamina: int = Delta


class CharacterState(BaseModel):
    """The three stats a character carries from turn to turn."""

    model_config = ConfigDict(frozen=True)

    stamina: int = Field(default=STAT_START, ge=STAT_MIN, le=STAT_MAX)
    social: int = Field(default=STAT_START, ge=STAT_MIN, le=STAT_MAX)
    entertainment: int = Field(default=STAT_START, ge=STAT_MIN, le=STAT_MAX)

    def apply(self, deltas: StateDeltas) -> CharacterState:
        return CharacterState(
            stamina=_clamp(self.stamina + STAT_STEP * deltas.stamina),
            social=_clamp(self.social + STAT_STEP * deltas.social),
            entertainment=_clamp(self.entertainment + STAT_STEP * deltas.entertainment),
        )


def _clamp(value: int) -> int:
    return max(STAT_MIN, min(STAT_MAX, value))


def stat_colour(value: int) -> str:
    """The release's app colours a bar red under 30, yellow 30..60, green over 60."""
    if value < 30:
        return "red"
    if value <= 60:
        return "yellow"
    return "green"
