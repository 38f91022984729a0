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

from game.errors import GameError
from game.text import TextError, clean_text, fold_for_model

EXPECTED_FORM = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."

MAX_FIELD_CHARS = 60  # one field; the release's demo fields are under 30
MAX_LINE_CHARS = 200  # the whole line; keeps the prompt near the release's 254 tokens

# Adverbs set the motion scope the model predicts; the release's demo uses the first four.
ADVERBS = frozenset({"quickly", "smoothly", "gently", "slowly", "calmly", "happily", "softly", "rapidly", "lazily"})
TIMES = frozenset({"day", "night", "evening", "morning", "dawn", "dusk", "noon", "sunset", "afternoon"})

# Letters and digits of any script, spaces, and the punctuation a sentence needs (typographic quotes, dashes
# and ellipses arrive here already plain, from ``clean_text``). Everything else (markdown, @mentions,
# <#channels>, emoji; zero-width and control characters are refused by ``clean_text``) is refused rather
# than stripped, so the player sees what was wrong.
_ALLOWED_PUNCTUATION = frozenset(" ',-!?&()\".")
# Combining marks write Thai vowels, Devanagari's virama and nukta, and accents NFC does not compose; a
# letter carries a few. Dozens stacked are "Zalgo" text that smears over the lines around it in Discord.
_MAX_MARKS = 3
# Combining marks that show nothing: the grapheme joiner, variation selectors, Mongolian selectors.
_INVISIBLE_MARKS = frozenset(
    "\u034f\u180b\u180c\u180d\u180f"
    + "".join(map(chr, range(0xFE00, 0xFE10)))
    + "".join(map(chr, range(0xE0100, 0xE01F0)))
)
_LABELLED = re.compile(
    r"^\s*character\s*:\s*(?P<character>[^;]*);\s*motion\s*:\s*(?P<motion>[^;]*);"
    r"\s*background\s*:\s*(?P<background>[^;]*?)\s*\.?\s*$",
    re.IGNORECASE,
)


class InstructionError(GameError):
    """A player's instruction that cannot be played; the message is safe to show them."""

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


def unreadable(stored: str) -> str | None:
    """Why this version cannot play an instruction an earlier one stored (its grammar or checks changed since), or
    None. Never raises, whatever the stored text: one such row must fail its own turn, not every duty that reads it."""
    try:
        parse(stored)
    except InstructionError as exc:
        return exc.reason
    except Exception as exc:  # a parser bug on some text is still that row's, not the tick's
        return f"{type(exc).__name__} while reading it"
    return None


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
    """One field as the model reads it: clean text, compatibility-folded, words and plain punctuation only.

    Folded (``ｚｏｒｂｌａｘ`` -> ``zorblax``, ``ﬁre`` -> ``fire``) when the folded field is still playable; kept
    as typed when it is not (``¼`` folds to ``1⁄4``, whose fraction slash the grammar refuses), so a field
    accepted once is accepted, unchanged, when its line is parsed again. Trailing dots are sentence
    punctuation, not part of the field: the line ends with its own period, and ``Background: sky....`` is not
    the form the model was trained on, so ``sky…`` and ``sky.`` become ``sky``.
    """
    typed = _checked_text(label, value).rstrip(". ")
    try:
        return _playable(label, _checked_text(label, fold_for_model(typed)).rstrip(". "))
    except InstructionError:
        return _playable(label, typed)  # and if it is not playable either, the player hears about what they typed


def _checked_text(label: str, value: str) -> str:
    try:
        return clean_text(value, label=label, max_chars=MAX_FIELD_CHARS)
    except TextError as exc:
        raise InstructionError(exc.reason) from None


def _playable(label: str, text: str) -> str:
    """Refuse anything but letters and digits (with their accents) and the allowed punctuation."""
    marks_left = 0  # how many more combining marks the preceding letter may carry
    for char in text:
        if unicodedata.category(char)[0] == "M" and marks_left > 0 and char not in _INVISIBLE_MARKS:
            marks_left -= 1
            continue
        if not (char.isalnum() or char in _ALLOWED_PUNCTUATION) or unicodedata.category(char) == "Co":
            visible = char.isprintable() and not char.isspace() and unicodedata.category(char)[0] != "M"
            shown = char if visible else f"U+{ord(char):04X}"
            raise InstructionError(f"{label} contains {shown!r}; use letters, digits and simple punctuation.")
        marks_left = _MAX_MARKS if char.isalnum() else 0
    if not any(char.isalnum() for char in text):
        raise InstructionError(f"{label} needs at least one letter or digit.")
    return text
