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
