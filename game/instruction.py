"""The AnimeGamer instruction grammar.

One turn is one line: ``Character: <who>; Motion: <adverb> <action>; Background: <time> <place>.``
The MLLM was trained on exactly this form, so anything a player types is parsed into it and
formatted back canonically before it reaches a model. Parsing is strict about characters
(no markup, no mentions, no invisible characters) because the text is echoed to Discord and
fed to a tokenizer; it is lenient about spacing, case of the labels and the final period.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

EXPECTED_FORM = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."

MAX_FIELD_CHARS = 60  # one field; the release's demo fields are under 30
MAX_LINE_CHARS = 200  # the whole line; keeps the prompt near the release's 254 tokens

# Adverbs set the motion scope the model predicts; the release's demo uses the first four.
ADVERBS = frozenset({"quickly", "smoothly", "gently", "slowly", "calmly", "happily", "softly", "rapidly", "lazily"})
TIMES = frozenset({"day", "night", "evening", "morning", "dawn", "dusk", "noon", "sunset", "afternoon"})

# Letters and digits of any script, spaces, and the punctuation a sentence needs.
# Everything else (markdown, @mentions, <#channels>, emoji, zero-width and control
# characters) is refused rather than stripped, so the player sees what was wrong.
_ALLOWED_PUNCTUATION = frozenset(" ',-!?&()")
_LABELLED = re.compile(
    r"^\s*character\s*:\s*(?P<character>[^;]*);\s*motion\s*:\s*(?P<motion>[^;]*);"
    r"\s*background\s*:\s*(?P<background>[^;]*?)\s*\.?\s*$",
    re.IGNORECASE,
)


class InstructionError(ValueError):
    """A player's instruction that cannot be played; the message is safe to show them."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason} Expected: `{EXPECTED_FORM}`"


@dataclass(frozen=True)
class Instruction:
    """A validated instruction; ``str()`` gives the canonical line the model reads."""

    character: str
    action: str
    place: str
    adverb: str = ""
    time: str = ""

    @property
    def motion(self) -> str:
        return f"{self.adverb} {self.action}".strip()

    @property
    def background(self) -> str:
        return f"{self.time} {self.place}".strip()

    def __str__(self) -> str:
        return f"Character: {self.character}; Motion: {self.motion}; Background: {self.background}."


def parse(text: str) -> Instruction:
    """Parse one instruction line, or raise InstructionError saying what is wrong."""
    if not isinstance(text, str):
        raise InstructionError("An instruction must be text.")
    if len(text) > MAX_LINE_CHARS * 2:
        raise InstructionError(f"That is {len(text)} characters; an instruction has at most {MAX_LINE_CHARS}.")
    match = _LABELLED.match(text)
    if match is None:
        raise InstructionError("Write the three labelled parts, separated by semicolons.")
    return from_fields(match["character"], match["motion"], match["background"])


def from_fields(character: str, motion: str, background: str, time: str = "") -> Instruction:
    """Build an instruction from separate fields (slash-command options) with the same checks."""
    character = _clean("Character", character)
    motion_words = _clean("Motion", motion).split(" ")
    background_words = _clean("Background", background).split(" ")
    if time:
        time = _clean("Time", time).lower()
        if time not in TIMES:
            raise InstructionError(f"Time must be one of: {', '.join(sorted(TIMES))}.")
        background_words = [time, *background_words]

    adverb = ""
    if len(motion_words) > 1 and motion_words[0].lower() in ADVERBS:
        adverb, motion_words = motion_words[0].lower(), motion_words[1:]
    day_time = ""
    if len(background_words) > 1 and background_words[0].lower() in TIMES:
        day_time, background_words = background_words[0].lower(), background_words[1:]

    instruction = Instruction(
        character=character,
        adverb=adverb,
        action=" ".join(motion_words),
        time=day_time,
        place=" ".join(background_words),
    )
    if len(str(instruction)) > MAX_LINE_CHARS:
        raise InstructionError(
            f"That is {len(str(instruction))} characters; an instruction has at most {MAX_LINE_CHARS}."
        )
    return instruction


def _clean(label: str, value: str) -> str:
    """Collapse spaces and refuse anything but words and plain punctuation."""
    if not isinstance(value, str):
        raise InstructionError(f"{label} must be text.")
    words = value.split()
    text = " ".join(words)
    if not text:
        raise InstructionError(f"{label} is empty.")
    if len(text) > MAX_FIELD_CHARS:
        raise InstructionError(f"{label} is {len(text)} characters; the most is {MAX_FIELD_CHARS}.")
    for char in text:
        if not (char.isalnum() or char in _ALLOWED_PUNCTUATION) or unicodedata.category(char) == "Co":
            shown = char if char.isprintable() and not char.isspace() else f"U+{ord(char):04X}"
            raise InstructionError(f"{label} contains {shown!r}; use letters, digits and simple punctuation.")
    if not any(char.isalnum() for char in text):
        raise InstructionError(f"{label} needs at least one letter or digit.")
    return text
