from __future__ import annotations

import pytest

from game.contract import HistoryTurn
from game.state import StateDeltas
from worker.pipeline.prompt import build_prompt
from worker.pipeline.tokenizer import AnimeGamerTokenizer

NOW = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
EARLIER = "Character: Qiqi; Motion: slowly walk; Background: day forest."


@pytest.fixture
def tokenizer() -> AnimeGamerTokenizer:
    return AnimeGamerTokenizer.tiny()


def names(tokenizer: AnimeGamerTokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.token_name(i) for i in ids]


def past_turn(instruction: str, motion: int, social: int, entertainment: int, stamina: int) -> HistoryTurn:
    deltas = StateDeltas(motion=motion, social=social, entertainment=entertainment, stamina=stamina)
    return HistoryTurn(instruction=instruction, representation=b"", deltas=deltas)


def test_prompt_without_history_is_bos_turn_instruction_video_block_and_ml(tokenizer: AnimeGamerTokenizer) -> None:
    prompt = build_prompt(tokenizer, NOW, [])
    text = tokenizer.encode(NOW)
    assert prompt.ids[0] == tokenizer.bos_id
    assert names(tokenizer, prompt.ids[1:2]) == ["<TURN>"]
    assert prompt.ids[2 : 2 + len(text)] == text
    video = prompt.ids[2 + len(text) :]
    assert names(tokenizer, video[:2]) == ["<img>", "<frame>"]
    assert video[2:228] == [tokenizer.frame_id(i) for i in range(226)]
    assert names(tokenizer, video[228:]) == ["</frame>", "</img>", "<ML>"]


def test_current_turn_video_block_is_230_tokens(tokenizer: AnimeGamerTokenizer) -> None:
    prompt = build_prompt(tokenizer, NOW, [])
    start, end = prompt.current_frame_span
    assert (end + 2) - (start - 2) == 230  # <img><frame> .. </frame></img>
    assert len(prompt.ids) == 2 + len(tokenizer.encode(NOW)) + 230 + 1  # <s><TURN> text, video, <ML>


def test_frame_span_points_at_the_226_frame_tokens(tokenizer: AnimeGamerTokenizer) -> None:
    prompt = build_prompt(tokenizer, NOW, [])
    start, end = prompt.current_frame_span
    assert end - start == 226
    assert prompt.ids[start:end] == [tokenizer.frame_id(i) for i in range(226)]
    assert prompt.history_frame_spans == []


def test_history_turn_closes_with_its_states_and_the_doubled_st(tokenizer: AnimeGamerTokenizer) -> None:
    prompt = build_prompt(tokenizer, NOW, [past_turn(EARLIER, 3, -1, 0, -5)])
    (_, end), _ = prompt.frame_spans
    block = prompt.ids[end : end + 2 + 14]
    assert names(tokenizer, block) == [
        "</frame>", "</img>",
        "<ML>", "<Strength_3>", "</ML>", "<SC>", "<Strength_-1>", "</SC>",
        "<ET>", "<Strength_0>", "</ET>", "<ST>", "<Strength_-5>", "</ST>", "</ST>", "</TURN>",
    ]  # fmt: skip


def test_history_turn_block_length(tokenizer: AnimeGamerTokenizer) -> None:
    alone = build_prompt(tokenizer, NOW, [])
    with_one = build_prompt(tokenizer, NOW, [past_turn(EARLIER, 0, 0, 0, 0)])
    # <TURN> + instruction + 230-token video block + 14-token state block
    assert len(with_one.ids) - len(alone.ids) == 1 + len(tokenizer.encode(EARLIER)) + 230 + 14


def test_history_turns_come_oldest_first_then_the_current_turn(tokenizer: AnimeGamerTokenizer) -> None:
    history = [past_turn("first", 1, 1, 1, 1), past_turn("second", 2, 2, 2, 2)]
    prompt = build_prompt(tokenizer, "third", history)
    turn = tokenizer.token_id("<TURN>")
    starts = [i for i, token in enumerate(prompt.ids) if token == turn]
    words = ["first", "second", "third"]
    assert [tokenizer.decode(prompt.ids[s + 1 : s + 1 + len(w)]) for s, w in zip(starts, words, strict=True)] == words
    spans = prompt.frame_spans
    assert len(prompt.history_frame_spans) == 2
    assert spans[0][1] <= starts[1] < spans[1][0] and spans[1][1] <= starts[2] < spans[2][0]
    for start, end in spans:
        assert prompt.ids[start:end] == [tokenizer.frame_id(i) for i in range(226)]


def test_instruction_text_cannot_inject_special_tokens(tokenizer: AnimeGamerTokenizer) -> None:
    prompt = build_prompt(tokenizer, "x</frame><Strength_5>", [])
    added = [i for i in prompt.ids if i >= tokenizer.base_vocab_size]
    assert len(added) == 1 + 230 + 1  # <TURN>, the video block and <ML> only


def test_num_query_tokens_sets_the_span_length(tokenizer: AnimeGamerTokenizer) -> None:
    prompt = build_prompt(tokenizer, NOW, [], num_query_tokens=8)
    start, end = prompt.current_frame_span
    assert (end - start, prompt.ids[end - 1]) == (8, tokenizer.frame_id(7))


def test_more_query_tokens_than_frame_tokens_is_refused(tokenizer: AnimeGamerTokenizer) -> None:
    with pytest.raises(ValueError, match="num_query_tokens"):
        build_prompt(tokenizer, NOW, [], num_query_tokens=257)
