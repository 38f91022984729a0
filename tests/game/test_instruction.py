import pytest
from hypothesis import given
from hypothesis import strategies as st

from game.instruction import EXPECTED_FORM, MAX_LINE_CHARS, Instruction, InstructionError, from_fields, parse

DEMO_LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."


def test_a_demo_line_parses_into_its_five_parts():
    instruction = parse(DEMO_LINE)
    assert instruction == Instruction(
        character="Qiqi", adverb="gently", action="fly on broomstick", time="night", place="sky"
    )


def test_formatting_a_parsed_line_gives_it_back_exactly():
    assert str(parse(DEMO_LINE)) == DEMO_LINE


def test_spacing_label_case_and_the_final_period_are_forgiven():
    assert str(parse("  character:Qiqi ;motion:  gently   fly on broomstick;BACKGROUND: night sky ")) == DEMO_LINE


def test_adverb_and_time_are_optional():
    instruction = parse("Character: Sosuke; Motion: wave; Background: beach.")
    assert (instruction.adverb, instruction.action, instruction.time, instruction.place) == ("", "wave", "", "beach")


def test_fields_build_the_same_instruction_as_a_line():
    assert from_fields("Qiqi", "gently fly on broomstick", "sky", time="night") == parse(DEMO_LINE)


@pytest.mark.parametrize(
    "text",
    [
        "Qiqi flies over the sky",
        "Character: Qiqi; Motion: ; Background: sky.",
        "Character: Qiqi; Background: sky.",
        "Character: <@123456>; Motion: wave; Background: town.",
        "Character: Qiqi; Motion: **fly**; Background: sky.",
        "Character: Qi\u200bqi; Motion: fly; Background: sky.",
        "Character: Qiqi; Motion: fly; Background: sky; Extra: x.",
        "Character: @everyone; Motion: fly; Background: sky.",
        "          ",
        "x" * 4000,
    ],
    ids=[
        "no labels",
        "empty motion",
        "missing motion",
        "mention",
        "markdown",
        "zero width",
        "extra part",
        "everyone",
        "only spaces",
        "4000 chars",
    ],
)
def test_bad_lines_are_refused_with_the_expected_form(text):
    with pytest.raises(InstructionError) as info:
        parse(text)
    assert EXPECTED_FORM in str(info.value)


def test_an_overlong_field_says_how_long_it_may_be():
    with pytest.raises(InstructionError, match="the most is 60"):
        from_fields("Qiqi", "fly " * 30, "sky")


def test_the_whole_line_has_a_length_limit():
    field = "a" * 55
    with pytest.raises(InstructionError, match=f"at most {MAX_LINE_CHARS}"):
        from_fields(field, field, f"{field} {field}"[:60])


def test_an_unknown_time_field_lists_the_known_ones():
    with pytest.raises(InstructionError, match="night"):
        from_fields("Qiqi", "fly", "sky", time="teatime")


@given(st.text())
def test_any_text_either_parses_to_a_valid_instruction_or_raises_the_clear_error(text):
    try:
        instruction = parse(text)
    except InstructionError as exc:
        assert EXPECTED_FORM in str(exc)
        return
    line = str(instruction)
    assert len(line) <= MAX_LINE_CHARS
    assert parse(line) == instruction


@given(st.text(alphabet=st.characters(categories=["L", "N"]), min_size=1, max_size=20))
def test_any_letters_make_a_character_name_that_survives_a_round_trip(name):
    instruction = from_fields(name, "gently wave", "day town")
    assert parse(str(instruction)) == instruction


# ---- phone keyboards, and the plain forms the model reads --------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "plain"),
    [
        ("Qiqi’s house", "Qiqi's house"),
        ("say “hello”", 'say "hello"'),
        ("harbor — waves", "harbor - waves"),
        ("ｚｏｒｂｌａｘ", "zorblax"),
        ("town\u00a0square", "town square"),
        ("town\u3000square", "town square"),
        ("ﬁre pit", "fire pit"),
        ("Mr. Tanaka's", "Mr. Tanaka's"),
    ],
    ids=["apostrophe", "quotes", "em dash", "fullwidth", "nbsp", "ideographic space", "ligature", "inner dot"],
)
def test_what_a_phone_keyboard_types_is_accepted_and_comes_out_plain(typed, plain):
    assert from_fields("Qiqi", "wave", typed).place == plain


def test_a_field_s_trailing_dots_are_sentence_punctuation_and_dropped():
    instruction = from_fields("Qiqi.", "wave...", "harbor…")
    assert (instruction.character, instruction.action, instruction.place) == ("Qiqi", "wave", "harbor")
    assert str(instruction) == "Character: Qiqi; Motion: wave; Background: harbor."


def test_a_field_of_only_dots_needs_a_letter():
    with pytest.raises(InstructionError, match="Background needs at least one letter or digit"):
        from_fields("Qiqi", "wave", "...")


def test_a_line_typed_on_a_phone_parses():
    line = "Character: Qiqi; Motion: gently wave at “Jiji”; Background: night harbor — waves…"
    assert str(parse(line)) == 'Character: Qiqi; Motion: gently wave at "Jiji"; Background: night harbor - waves.'


def test_a_form_that_folds_into_refused_characters_is_kept_as_typed():
    # ¼ folds to 1⁄4, and the fraction slash is not simple punctuation.
    assert from_fields("Qiqi", "wave", "¼ mile").place == "¼ mile"


@pytest.mark.parametrize("word", ["ทำอาหาร", "नमस्ते", "गाँव"], ids=["thai", "devanagari", "candrabindu"])
def test_scripts_written_with_combining_marks_are_letters(word):
    instruction = from_fields("Qiqi", "wave", word)
    assert parse(str(instruction)) == instruction


@pytest.mark.parametrize(
    ("field", "shown"),
    [
        ("wave at <@1>", "'<'"),
        ("wave at @everyone", "'@'"),
        ("**fly**", "'*'"),
        ("fly `high`", "'`'"),
        ("fly ~~low~~", "'~'"),
        ("fly ||high||", "'|'"),
        ("> fly", "'>'"),
        ("# fly", "'#'"),
        ("fly\ufe0f", "U+FE0F"),
        ("\u0301fly", "U+0301"),
        ("fly\u0336\u0336\u0336\u0336", "U+0336"),
    ],
    ids=[
        "mention",
        "everyone",
        "bold",
        "code",
        "strike",
        "spoiler",
        "quote",
        "heading",
        "variation selector",
        "accent on nothing",
        "zalgo",
    ],
)
def test_mentions_markdown_and_stray_marks_stay_refused(field, shown):
    with pytest.raises(InstructionError, match="Motion contains") as info:
        from_fields("Qiqi", field, "town")
    assert shown in info.value.reason


@pytest.mark.parametrize(
    ("char", "code"), [("\u200b", "U+200B"), ("\u202e", "U+202E"), ("\x00", "U+0000"), ("\ud800", "U+D800")]
)
def test_invisible_control_and_invalid_characters_are_refused_showing_their_code(char, code):
    with pytest.raises(InstructionError, match="Motion contains") as info:
        from_fields("Qiqi", f"fly{char}", "sky")
    assert code in info.value.reason


@given(st.text(), st.text(), st.text())
def test_any_instruction_built_from_fields_survives_a_round_trip(character, motion, background):
    try:
        instruction = from_fields(character, motion, background)
    except InstructionError:
        return
    assert parse(str(instruction)) == instruction


@given(st.text(alphabet=st.characters(codec=None, categories=None)), st.text(alphabet=st.characters(codec=None)))
def test_any_code_points_in_fields_give_an_instruction_or_the_clear_error(motion, background):
    try:
        instruction = from_fields("Qiqi", motion, background)
    except InstructionError as exc:
        assert EXPECTED_FORM in str(exc)
        return
    assert parse(str(instruction)) == instruction
