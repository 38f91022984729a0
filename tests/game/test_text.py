"""Input hygiene (``clean_text``), the model's plain forms (``fold_for_model``) and blocked-term skeletons."""

from __future__ import annotations

import pickle
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from game.text import TextError, clean_text, contains_term, find_term, fold_for_model, skeleton

# Any code point at all, unpaired surrogates, controls and unassigned ones included.
ANY_TEXT = st.text(alphabet=st.characters(codec=None, categories=None))


def clean(value: object, max_chars: int = 100) -> str:
    return clean_text(value, label="Title", max_chars=max_chars)


def refusal(value: object, max_chars: int = 100) -> str:
    with pytest.raises(TextError) as info:
        clean(value, max_chars)
    return info.value.reason


# ---- clean_text: what phone keyboards type comes out plain --------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "plain"),
    [
        ("Qiqi’s house", "Qiqi's house"),
        ("‘single’ ‚low‛ 5′ itʼs ＇x＇", "'single' 'low' 5' it's 'x'"),
        ("“hello”", '"hello"'),
        ("„low‟ 5″ ＂x＂", '"low" 5" "x"'),
        ("harbor — waves", "harbor - waves"),
        ("a‐b a‑b a‒b a–b a—b a―b a−b", "a-b a-b a-b a-b a-b a-b a-b"),
        ("wait…", "wait..."),
    ],
    ids=[
        "apostrophes",
        "single quotes and primes",
        "double quotes",
        "more double quotes",
        "em dash",
        "dashes",
        "ellipsis",
    ],
)
def test_typographic_punctuation_comes_out_plain(typed, plain):
    assert clean(typed) == plain


@pytest.mark.parametrize(
    "space",
    ["\u00a0", "\u202f", "\u2007", "\u3000", "\u2002", "\u2003", "\u2009", "\t", "\n", "\r", "\u2028", "\u2029"],
)
def test_every_kind_of_space_and_line_break_becomes_one_plain_space(space):
    assert clean(f"night{space}{space}sky") == "night sky"


def test_runs_of_spaces_collapse_and_the_ends_are_stripped():
    assert clean("   night \t  sky  ") == "night sky"


def test_text_comes_out_composed():
    assert clean("cafe\u0301") == "café"


def test_fullwidth_letters_are_kept_as_typed_until_folded_for_the_model():
    assert clean("ｚｏｒｂｌａｘ") == "ｚｏｒｂｌａｘ"
    assert fold_for_model(clean("ｚｏｒｂｌａｘ")) == "zorblax"


def test_folding_for_the_model_gives_plain_ascii_where_unicode_says_so():
    assert fold_for_model("ﬁre ① 𝐳𝐨𝐫𝐛") == "fire 1 zorb"


# ---- clean_text: what is refused, and how it is named --------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("a\x00b", "U+0000"),
        ("\x1b[31mred", "U+001B"),
        ("abc\u202edcba", "U+202E"),
        ("qi\u200bqi", "U+200B"),
        ("word\u2060joiner", "U+2060"),
        ("\ufeffbom", "U+FEFF"),
        ("soft\u00adhyphen", "U+00AD"),
        ("left\u200emark", "U+200E"),
        ("isolate\u2066x\u2069", "U+2066"),
        ("private \ue000", "U+E000"),
        ("unassigned \u0378", "U+0378"),
    ],
    ids=[
        "NUL",
        "escape",
        "RLO",
        "zero width space",
        "word joiner",
        "BOM",
        "soft hyphen",
        "LRM",
        "isolate",
        "private use",
        "unassigned",
    ],
)
def test_an_invisible_or_control_character_is_refused_showing_its_code(value, code):
    assert refusal(value) == f"Title contains an invisible or control character ({code})."


def test_an_unpaired_surrogate_is_refused_as_an_invalid_character():
    assert refusal("a\ud800b") == "Title contains an invalid character (U+D800)."


@pytest.mark.parametrize(
    "value", ["", "  \t ", "\u3000\u00a0", "\u0301\u0301"], ids=["nothing", "whitespace", "odd spaces", "only accents"]
)
def test_text_with_nothing_visible_is_empty(value):
    assert refusal(value) == "Title is empty."


def test_zero_width_only_text_is_refused_showing_the_character():
    assert refusal("\u200b\u200b") == "Title contains an invisible or control character (U+200B)."


def test_something_that_is_not_text_is_refused():
    assert refusal(42) == "Title must be text."


def test_the_length_limit_counts_the_cleaned_text_and_does_not_echo_it():
    assert clean("a" + " " * 50 + "b", max_chars=3) == "a b"
    reason = refusal("x" * 4000, max_chars=60)
    assert reason == "Title is 4000 characters; the most is 60."


def test_the_error_is_the_reason_and_pickles():
    error = TextError("Title is empty.")
    assert str(error) == error.reason == "Title is empty."
    assert pickle.loads(pickle.dumps(error)).reason == "Title is empty."


# ---- clean_text: properties over any text --------------------------------------------------------------------

REFUSED_CATEGORIES = {"Cc", "Cf", "Co", "Cn", "Cs"}


@given(ANY_TEXT, st.integers(min_value=1, max_value=50))
def test_any_text_is_refused_or_comes_out_visible_single_spaced_and_within_the_limit(value, max_chars):
    try:
        text = clean(value, max_chars)
    except TextError:
        return
    assert not any(unicodedata.category(char) in REFUSED_CATEGORIES for char in text)
    assert text == text.strip(" ") and "  " not in text
    assert 0 < len(text) <= max_chars


@given(ANY_TEXT)
def test_cleaning_twice_changes_nothing(value):
    try:
        once = clean(value)
    except TextError:
        return
    assert clean(once) == once


# ---- skeleton and blocked terms ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "ｚｏｒｂｌａｘ",
        "zоrblax",  # Cyrillic о
        "z o r b l a x",
        "zorb-lax",
        "ZORBLAX",
        "zor.blax",
        "z_o_r_b_l_a_x",
        "𝐳𝐨𝐫𝐛𝐥𝐚𝐱",
        "zórblax",  # precomposed ó
        "zo\u0301rblax",  # o and a combining acute
        "z0rblax",
        "zοrblαx",  # Greek omicron and alpha
        "zⲟrblax",  # Coptic o
        "ΖΟRΒLΑΧ",  # Greek capitals that look Latin
        "zόrblax",  # Greek omicron with tonos
        "z\u200bo\u200br\u200bblax",
        "the zorblax is here",
    ],
    ids=[
        "fullwidth",
        "cyrillic o",
        "spaced",
        "hyphenated",
        "upper case",
        "dotted",
        "underscored",
        "mathematical bold",
        "precomposed accent",
        "combining accent",
        "digit zero",
        "greek small",
        "coptic",
        "greek capitals",
        "greek with tonos",
        "zero width",
        "inside a sentence",
    ],
)
def test_a_disguised_term_is_found(text):
    assert contains_term(text, "zorblax")


@pytest.mark.parametrize("text", ["zebra lax", "zorb", "blax zor", ""])
def test_a_term_is_not_found_in_text_that_does_not_spell_it(text):
    assert not contains_term(text, "zorblax")


def test_the_skeleton_keeps_only_letters_and_digits_of_the_look_alike_forms():
    assert skeleton("Zorb-Lax 2") == skeleton("z o r b l a x ２") == "zorblax2"


def test_case_does_not_split_letters_the_data_calls_look_alikes():
    assert skeleton("KILL") == skeleton("kill") == skeleton("KІLL")  # the last with a Cyrillic І


def test_a_term_with_no_letter_or_digit_matches_nothing():
    assert skeleton("---") == ""
    assert not contains_term("a --- b", "---")
    assert not contains_term("anything", "")


def test_find_term_returns_the_first_matching_term_as_stored():
    assert find_term("the Z O R B L A X flies", ["goblin", "Zorb-Lax", "zorblax"]) == "Zorb-Lax"
    assert find_term("a calm harbor", ["goblin", "zorblax"]) is None
    assert find_term("anything", ["...", ""]) is None


@given(ANY_TEXT)
def test_any_text_contains_itself_when_its_skeleton_is_not_empty(text):
    if skeleton(text):
        assert contains_term(text, text)


@given(ANY_TEXT, ANY_TEXT, ANY_TEXT)
def test_a_term_is_found_wherever_the_text_contains_it(before, term, after):
    if skeleton(term):
        assert contains_term(before + term + after, term)


@given(ANY_TEXT)
def test_a_skeleton_is_its_own_skeleton(text):
    key = skeleton(text)
    assert skeleton(key) == key
