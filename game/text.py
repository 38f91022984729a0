"""Input hygiene for every piece of free text a player or an admin types, and the key blocked terms match on.

Two jobs, kept apart on purpose:

``clean_text`` decides what may be *stored and shown*. Phone keyboards type typographic punctuation
(``Qiqi’s``, ``“hello”``, ``harbor — waves``) and odd spaces (NBSP, the ideographic space); those are
mapped to the plain forms the model was trained on. What cannot be shown safely (control characters, NUL,
escape sequences, right-to-left overrides, zero-width characters, private-use and unassigned code points,
unpaired surrogates) is refused, never silently dropped, with its code point in the message, so the
player sees what was wrong and nothing invisible reaches Discord, the database or a tokenizer.

``skeleton`` decides what *counts as the same word* for blocked terms. A plain lower-case substring check
is evaded by fullwidth letters (``ｚｏｒｂｌａｘ``), look-alikes from other scripts (Cyrillic ``о`` for
Latin ``o``), mathematical alphabets, accents, and by spacing or punctuating a word apart (``z o r b l a
x``, ``zorb-lax``). So both the term and the text are reduced to a skeleton: compatibility-folded, case-
folded, every character replaced by the representative of its Unicode confusables class (UTS #39, the
data shipped with ``confusable_homoglyphs``), accents dropped, and everything that is not a letter or a
digit removed. The skeleton is a matching key only; it is never stored or shown.

Pure: the standard library and ``confusable_homoglyphs`` only.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable

from confusable_homoglyphs import confusables

from game.errors import GameError

# ---- clean_text ------------------------------------------------------------------------------------------


class TextError(GameError):
    """Free text that cannot be used; ``reason`` (also ``str(exc)``) is safe to show a Discord user."""


# Typographic forms phone keyboards and word processors type, and the plain forms the model was trained on.
_TYPOGRAPHIC = {
    **dict.fromkeys("‘’‚‛′ʼ＇", "'"),
    **dict.fromkeys("“”„‟″＂", '"'),
    **dict.fromkeys("‐‑‒–—―−", "-"),
    "…": "...",
}
# Every space separator (all of them are in the Basic Multilingual Plane) and the line breaks: one plain space.
_SPACES = [chr(code) for code in range(0x10000) if unicodedata.category(chr(code)) == "Zs"] + list("\t\n\r\u2028\u2029")
_PLAIN = str.maketrans({**_TYPOGRAPHIC, **dict.fromkeys(_SPACES, " ")})

# Control, format (zero-width, bidi overrides, soft hyphen, BOM...), private-use and unassigned characters.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cn"})


def clean_text(value: object, *, label: str, max_chars: int) -> str:
    """The one gate for free text (instruction fields, titles, names, blocked terms, ban reasons).

    Returns the text with typographic punctuation and odd spaces made plain, NFC-normalized, runs of spaces
    collapsed and the ends stripped; raises TextError saying, under ``label``, what is wrong. The text itself
    is never echoed, so a 4,000-character paste or an escape sequence does not come back to the channel.
    """
    # 1. Only text, and only text that can be encoded (an unpaired surrogate cannot be, in UTF-8 or anywhere).
    if not isinstance(value, str):
        raise TextError(f"{label} must be text.")
    for char in value:
        if unicodedata.category(char) == "Cs":
            raise TextError(f"{label} contains an invalid character ({_code(char)}).")

    # 2. Plain punctuation and spaces, then one canonical composition.
    text = unicodedata.normalize("NFC", value.translate(_PLAIN))

    # 3. Refuse what is invisible or unassigned rather than drop it: dropping would hide what was typed.
    for char in text:
        if unicodedata.category(char) in _INVISIBLE_CATEGORIES:
            raise TextError(f"{label} contains an invisible or control character ({_code(char)}).")

    # 4. One space between words; something visible must be left (combining marks alone are not).
    text = " ".join(word for word in text.split(" ") if word)
    if not any(unicodedata.category(char)[0] in "LNSP" for char in text):
        raise TextError(f"{label} is empty.")

    # 5. The limit counts what is kept, and the message gives the count, not the text.
    if len(text) > max_chars:
        raise TextError(f"{label} is {len(text)} characters; the most is {max_chars}.")
    return text


def fold_for_model(text: str) -> str:
    """NFKC of clean text: fullwidth letters, ligatures, circled digits become the plain forms the model read.

    Not part of ``clean_text`` because titles and reasons are shown as typed; instructions and character
    names are fed to a tokenizer, which has seen ``zorblax`` and not ``ｚｏｒｂｌａｘ``. The result may need
    ``clean_text`` again (NFKC can lengthen text, or turn a symbol into spaces and primes).
    """
    return unicodedata.normalize("NFKC", text)


def _code(char: str) -> str:
    return f"U+{ord(char):04X}"


# ---- skeleton ----------------------------------------------------------------------------------------------

# Some homoglyphs in the data carry left-to-right / right-to-left marks (around Hebrew and Arabic letters).
_DIRECTION_MARKS = "\u200e\u200f"


def _build_homoglyph_map() -> dict[str, str]:
    """Each confusable character -> the string it is matched as; built once, at import.

    Single-character homoglyph pairs are unioned into classes (the data is not fully symmetric, so the union
    is what makes ``a ~ b ~ c`` one class). Each class's representative is its ASCII member when it has
    one, preferring a lower-case letter, then an upper-case letter, then a digit (so ``{0, O, Ο, О}`` is
    matched as ``O``, which the later case fold makes ``o``, and ``{1, I, l, |}`` as ``l``); a class with no
    ASCII member is matched as its smallest code point. A character whose only homoglyphs are strings
    (``m`` -> ``rn``) is matched as the first string, mapped through the classes.
    """
    parent: dict[str, str] = {}

    def root(char: str) -> str:
        parent.setdefault(char, char)
        while parent[char] != char:
            parent[char] = parent[parent[char]]
            char = parent[char]
        return char

    multi_only: dict[str, str] = {}
    for key, entries in confusables.confusables_data.items():
        char = key.strip(_DIRECTION_MARKS)
        if len(char) != 1:
            continue  # a few keys are sequences (two combining marks): no single character to map
        homoglyphs = [entry["c"].strip(_DIRECTION_MARKS) for entry in entries]
        singles = [glyph for glyph in homoglyphs if len(glyph) == 1]
        root(char)
        for glyph in singles:
            a, b = root(char), root(glyph)
            if a != b:
                parent[max(a, b)] = min(a, b)
        if not singles and homoglyphs:
            multi_only[char] = homoglyphs[0]

    classes: dict[str, list[str]] = {}
    for char in parent:
        classes.setdefault(root(char), []).append(char)
    mapping: dict[str, str] = {}
    for members in classes.values():
        mapping.update(dict.fromkeys(members, _representative(members)))
    for char, glyphs in multi_only.items():
        # Through the single-character classes only, so no chain of strings can loop.
        mapping[char] = "".join(mapping.get(c, c) for c in glyphs)
    return mapping


def _representative(members: list[str]) -> str:
    ascii_members = [char for char in members if char.isascii()]
    if ascii_members:
        return min(ascii_members, key=lambda c: (not c.islower(), not c.isalpha(), not c.isdigit(), c))
    return min(members)


_HOMOGLYPHS = _build_homoglyph_map()


def skeleton(text: str) -> str:
    """The key blocked terms are matched on; equal for ``zorblax``, ``ｚｏｒｂｌａｘ``, ``zоrblax``, ``z o r b-lax``.

    NFKD first: fullwidth and mathematical letters and ligatures become plain, and accents come apart from
    their letters, so ``ό`` (Greek omicron with tonos) is matched as ``o`` like a bare ``ο``. Then each
    character's key (``_key``). Character by character on purpose: a term's key is then a substring of the
    text's key wherever the text contains the term. Never shown or stored: it is deliberately lossy.
    """
    return "".join(_key(char) for char in unicodedata.normalize("NFKD", text))


@functools.lru_cache(maxsize=65536)
def _key(char: str) -> str:
    """One decomposed character's part of the skeleton: its look-alike, case-folded, letters and digits only.

    Accents (combining marks), spaces, hyphens, dots, underscores and zero-width characters give nothing,
    since spelling a word apart (``z o r b-l.a_x``) must not hide it. Repeated to a fixed point because a
    look-alike can itself decompose or fold into another (``Ǣ`` -> ``æ`` -> ``ae``, ``ß`` -> ``ss``).
    """
    key = char
    for _ in range(4):
        bare = (c for c in unicodedata.normalize("NFKD", key) if unicodedata.category(c)[0] != "M")
        again = "".join(c for c in "".join(map(_glyph, bare)).casefold() if unicodedata.category(c)[0] in "LN")
        if again == key:
            break
        key = again
    return key


def _glyph(char: str) -> str:
    """A character's look-alike: of its lower-case form, or of the form as typed when only that looks Latin.

    Case-folding first keeps ``KILL`` and ``kill`` one key (capital ``I`` is in the ``l`` class, small ``i``
    is not). But some capitals look Latin while their small letters do not: Greek ``Ζ`` is ``Z``, its ``ζ``
    is like nothing, so ``ΖΟRΒLΑΧ`` would slip past ``zorblax``. So when the folded character has no Latin
    look-alike and the character as typed has one, the typed one wins.
    """
    folded = _map(char.casefold())
    if folded.isascii():
        return folded
    as_typed = _HOMOGLYPHS.get(char, char)
    return _map(as_typed.casefold()) if as_typed.isascii() else folded


def _map(text: str) -> str:
    return "".join(_HOMOGLYPHS.get(char, char) for char in text)


def contains_term(text: str, term: str) -> bool:
    """Whether ``text`` spells ``term``, however disguised; a term with an empty skeleton matches nothing."""
    key = skeleton(term)
    return bool(key) and key in skeleton(text)


def find_term(text: str, terms: Iterable[str]) -> str | None:
    """The first of ``terms`` (as given) that ``text`` contains by skeleton, or None."""
    text_key = skeleton(text)
    for term in terms:
        key = skeleton(term)
        if key and key in text_key:
            return term
    return None
