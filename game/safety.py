"""What may be posted where: a clip's safety report, as a worker sends it, and the server's policy over it. Pure.

A worker runs a nudity detector over the clip's frames (``worker/safety.py``) and sends, with the result, the highest
score each of the detector's labels reached in any frame. The bot reads the highest score of the labels that mean
exposed nudity against the server's threshold; the server's policy says where a clip over it may be posted. A clip
its worker could not check (no detector, or the detector failed) is treated as flagged and posted nowhere: the
check fails closed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

# NudeNet's labels that mean exposed nudity. Covered parts, faces, feet, bellies, armpits and a male chest are
# ordinary in anime and are reported but never flag a clip.
UNSAFE_LABELS = frozenset(
    {
        "FEMALE_BREAST_EXPOSED",
        "FEMALE_GENITALIA_EXPOSED",
        "MALE_GENITALIA_EXPOSED",
        "BUTTOCKS_EXPOSED",
        "ANUS_EXPOSED",
    }
)
# The score at or above which a clip is flagged. NudeNet reports a box from 0.2; over 442 frames this project makes
# (the toy model's demo story, the tiny model, the toy world; benchmarks/safety_check.py) the highest unsafe score
# was 0.33, a blurred toy frame read as MALE_GENITALIA_EXPOSED; 12 frames reached 0.1, 2 reached 0.2, none 0.4.
# 0.5 keeps a clear margin over that noise of drawn, blurry frames and still flags what the detector is more sure
# of than not.
DEFAULT_THRESHOLD = 0.5


class SafetyReport(BaseModel):
    """What the worker's detector saw in one clip; ``error`` says why a clip was not checked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    detector: str = Field(default="", description="which detector and model, '' when none ran")
    scores: dict[str, float] = Field(default_factory=dict, description="label -> highest score in any frame")
    frames: int = Field(default=0, ge=0, description="frames the detector looked at")
    seconds: float = Field(default=0.0, ge=0.0)
    error: str | None = Field(default=None, description="why the clip was not checked; None once it was")

    @property
    def checked(self) -> bool:
        return self.error is None and self.frames > 0

    def unsafe(self) -> tuple[str, float]:
        """The unsafe label that scored highest, and its score (('', 0.0) when none scored)."""
        found = [(score, label) for label, score in self.scores.items() if label in UNSAFE_LABELS]
        if not found:
            return "", 0.0
        score, label = max(found)
        return label, score


def unchecked(why: str) -> SafetyReport:
    """The report of a clip no detector looked at: it is withheld wherever it would go."""
    return SafetyReport(error=why)


class SafetyPolicy(enum.StrEnum):
    """What a server does with a flagged clip (``/admin safety``)."""

    WITHHOLD = "withhold"  # posted nowhere: the default
    AGE_RESTRICTED = "age_restricted"  # posted as is in age-restricted channels, withheld in the others


POLICY_WORDS = {
    SafetyPolicy.WITHHOLD: "flagged clips are never posted",
    SafetyPolicy.AGE_RESTRICTED: "flagged clips are posted in age-restricted channels only",
}


@dataclass(frozen=True)
class Verdict:
    """The bot's decision on one clip: post it or not, and in words why (for the player and the audit log)."""

    post: bool
    flagged: bool  # over the threshold, or never checked
    why: str
    checked: bool = True  # False: the worker sent no scores (no detector, or it failed)


def judge(report: SafetyReport, threshold: float, policy: SafetyPolicy, age_restricted: bool) -> Verdict:
    """Whether a clip may be posted in a channel, ``age_restricted`` or not, under a server's policy."""
    if not report.checked:
        return Verdict(False, True, f"it could not be checked ({report.error or 'no frames were checked'})", False)
    label, score = report.unsafe()
    if score < threshold:
        return Verdict(True, False, "")
    seen = f"the nudity detector flagged it ({label.replace('_', ' ').lower()}, {score:.2f} >= {threshold:.2f})"
    if policy is SafetyPolicy.AGE_RESTRICTED and age_restricted:
        return Verdict(True, True, f"{seen}; posted because this channel is age-restricted")
    if policy is SafetyPolicy.AGE_RESTRICTED:
        return Verdict(False, True, f"{seen}, and this channel is not age-restricted")
    return Verdict(False, True, seen)
