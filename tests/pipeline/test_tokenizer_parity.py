"""Our id-built prompt against the release's string-built prompt, tokenized by transformers itself.

The release loads ``transformers.LlamaTokenizer.from_pretrained(".../animegamer_tokenizer")``
(MLLM/configs/tokenizer/tokenizer.yaml): the slow, SentencePiece tokenizer, and the folder's
tokenizer_config.json says ``legacy: false``. It builds each turn as three strings (inference_MLLM.py,
app.py) and encodes each with ``add_special_tokens=False`` after ``[bos_token_id]``.

transformers 5 has no slow ``LlamaTokenizer`` any more (the name is the tokenizers-backed class), but it
keeps the slow machinery as ``SentencePieceBackend``: the same split on added tokens
(``PreTrainedTokenizer.tokenize``) and the same non-legacy ``_tokenize`` (SentencePiece's dummy prefix
switched off through protobuf; a span that starts with a space is encoded behind ``<unk>``, whose pieces
are dropped). The one part of 4.x ``LlamaTokenizer`` it lacks is the ``tokenize`` override (turn "▁" into
spaces, put a "▁" before the text when ``add_prefix_space``, drop that "▁" again when a special token
follows it); ``SlowLlamaTokenizer`` below restores it as transformers 4.44 wrote it. Under transformers 4.x
the real slow ``LlamaTokenizer`` is used instead. The reference ids are therefore transformers' own, and
the prompt strings are written here from the release's code, apart from ``build_prompt``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from game.contract import HistoryTurn
from game.state import StateDeltas
from worker.pipeline.mllm import release_processor_ids
from worker.pipeline.prompt import build_prompt
from worker.pipeline.tokenizer import AnimeGamerTokenizer

REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference"
TOKENIZER_DIR = REFERENCE / "animegamer_tokenizer"
DEMO = REFERENCE / "demo.txt"

NUM_MM_TOKENS = 226  # inference_MLLM.py: num_mm_tokens
Release = Any  # a transformers slow tokenizer; its class depends on the installed major version


def _slow_llama_class(add_prefix_space: bool | None) -> type:
    """transformers' slow Llama tokenizer: 4.x's own class, or 5.x's SentencePieceBackend plus 4.x's tokenize."""
    try:
        from transformers.tokenization_utils_sentencepiece import SPIECE_UNDERLINE, SentencePieceBackend
    except ImportError:  # transformers 4.x: LlamaTokenizer is still the slow class
        from transformers import LlamaTokenizer

        return LlamaTokenizer

    class SlowLlamaTokenizer(SentencePieceBackend):
        def tokenize(self, text: str, **kwargs: Any) -> list[str]:
            # transformers 4.44 LlamaTokenizer.tokenize, non-legacy branch
            if self.legacy or not text:
                return super().tokenize(text, **kwargs)
            text = text.replace(SPIECE_UNDERLINE, " ")
            if add_prefix_space:
                text = SPIECE_UNDERLINE + text
            tokens = super().tokenize(text, **kwargs)
            if len(tokens) > 1 and tokens[0] == SPIECE_UNDERLINE and tokens[1] in self.all_special_tokens:
                tokens = tokens[1:]
            return tokens

    return SlowLlamaTokenizer


def load_release_tokenizer(add_prefix_space: bool | None = None) -> Release:
    # 4.x's from_pretrained passes the config's "add_prefix_space": null through, i.e. None.
    cls = _slow_llama_class(add_prefix_space)
    tokenizer = cls.from_pretrained(str(TOKENIZER_DIR), add_prefix_space=add_prefix_space)
    assert not tokenizer.legacy, "the release's tokenizer_config.json sets legacy: false"
    assert len(tokenizer) == 32284
    return tokenizer


def release_turn_strings(instruction: str, states: Sequence[int] | None) -> list[str]:
    """One turn as the release writes it: caption, video and world strings (states = ML, SC, ET, ST)."""
    caption = "<TURN>" + instruction
    frames = "".join(f"<frame_{i:05d}>" for i in range(NUM_MM_TOKENS))
    video = "<img>" + ("<frame>" + frames + "</frame>") * 1 + "</img>"
    if states is None:  # the current turn stops where the state pass continues
        return [caption, video, "<ML>"]
    ml, sc, et, st = (f"<Strength_{value:d}>" for value in states)
    world = f"<ML>{ml}</ML><SC>{sc}</SC><ET>{et}</ET><ST>{st}</ST></ST></TURN>"  # </ST> twice, as released
    return [caption, video, world]


def release_prompt_ids(
    tokenizer: Release, instruction: str, history: Sequence[tuple[str, Sequence[int]]] = ()
) -> list[int]:
    """``[bos] + caption_ids + video_ids + world_ids`` per past turn, then the current turn.

    The release's own history loop takes the states from ``character_states[gen_turn_id]`` (the current
    turn's) and never runs with its ``max_window = 1``; here each past turn carries its own states.
    """
    ids = [tokenizer.bos_token_id]
    turns = [*((text, states) for text, states in history), (instruction, None)]
    for text, states in turns:
        for part in release_turn_strings(text, states):
            ids += tokenizer.encode(part, add_special_tokens=False)
    return ids


def history_turn(instruction: str, states: Sequence[int]) -> HistoryTurn:
    ml, sc, et, st = states
    deltas = StateDeltas(motion=ml, social=sc, entertainment=et, stamina=st)
    return HistoryTurn(instruction=instruction, representation=b"", deltas=deltas)


@pytest.fixture(scope="module")
def reference() -> Path:
    if not (TOKENIZER_DIR / "tokenizer.model").is_file() or not DEMO.is_file():
        pytest.skip(reason=f"the release's tokenizer files and demo lines are not at {REFERENCE}")
    return REFERENCE


@pytest.fixture(scope="module")
def release(reference: Path) -> Release:
    pytest.importorskip("sentencepiece")
    pytest.importorskip("google.protobuf", reason="the non-legacy slow tokenizer needs protobuf")
    return load_release_tokenizer()


@pytest.fixture(scope="module")
def ours(reference: Path) -> AnimeGamerTokenizer:
    return AnimeGamerTokenizer.from_checkpoint_dir(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def demo_lines(reference: Path) -> list[str]:
    lines = [line.strip() for line in DEMO.read_text(encoding="utf-8").splitlines()]  # as inference_MLLM.py
    return [line for line in lines if line]


def test_every_demo_line_encodes_as_the_release_encodes_it_after_turn(
    release: Release, ours: AnimeGamerTokenizer, demo_lines: list[str]
) -> None:
    assert len(demo_lines) == 8
    for line in demo_lines:
        expected = release.encode("<TURN>" + line, add_special_tokens=False)
        assert [ours.token_id("<TURN>"), *ours.encode(line)] == expected, line


def test_every_demo_line_prompt_equals_the_release_prompt(
    release: Release, ours: AnimeGamerTokenizer, demo_lines: list[str]
) -> None:
    for line in demo_lines:
        assert build_prompt(ours, line, []).ids == release_prompt_ids(release, line), line


def test_first_demo_line_prompt_is_254_ids(release: Release, ours: AnimeGamerTokenizer, demo_lines: list[str]) -> None:
    expected = release_prompt_ids(release, demo_lines[0])
    prompt = build_prompt(ours, demo_lines[0], [])
    assert len(expected) == 254
    assert prompt.ids == expected
    # The first text piece carries no "▁": "Character" (15962), not "▁Character" (23471).
    assert expected[:3] == [1, 32282, 15962]
    assert expected[-3:] == [32261, 32257, 32274]  # </frame></img><ML>


@pytest.mark.parametrize("num_past", [1, 2])
def test_prompt_with_history_equals_the_release_prompt(
    release: Release, ours: AnimeGamerTokenizer, demo_lines: list[str], num_past: int
) -> None:
    states = [(3, -1, 0, -5), (-2, 4, 1, 5)]
    past = list(zip(demo_lines[:num_past], states[:num_past], strict=True))
    current = demo_lines[num_past]
    expected = release_prompt_ids(release, current, past)
    prompt = build_prompt(ours, current, [history_turn(text, s) for text, s in past])
    assert prompt.ids == expected
    assert len(prompt.frame_spans) == num_past + 1
    for start, end in prompt.frame_spans:
        assert expected[start:end] == list(range(32000, 32000 + NUM_MM_TOKENS))


def test_the_state_pass_processor_ids_are_what_the_release_encodes(release: Release, ours: AnimeGamerTokenizer) -> None:
    # generation.py: AutoVideoTokenGenerationProcessor encodes <frame>, 100 frame names and </frame> as one string
    names = "<frame>" + "".join(f"<frame_{i:05d}>" for i in range(100)) + "</frame>"
    assert release_processor_ids(ours) == release.encode(names, add_special_tokens=False)


def test_add_prefix_space_does_not_change_the_release_ids(release: Release, demo_lines: list[str]) -> None:
    # The config says null; every string the release encodes starts with a special token, which drops the "▁".
    with_prefix = load_release_tokenizer(add_prefix_space=True)
    past = [(demo_lines[0], (1, 2, 3, 4))]
    for line in demo_lines[1:3]:
        assert release_prompt_ids(with_prefix, line, past) == release_prompt_ids(release, line, past)


def test_leading_and_doubled_spaces_match_the_release(release: Release, ours: AnimeGamerTokenizer) -> None:
    for text in (" Character: Qiqi", "two  spaces ", "a\u2581b", "\u6674\u308c \u00e9"):
        expected = release.encode("<TURN>" + text, add_special_tokens=False)
        assert [ours.token_id("<TURN>"), *ours.encode(text)] == expected, repr(text)


def test_a_mistral_directory_with_only_tokenizer_model_gives_the_same_prompt(
    release: Release, demo_lines: list[str], tmp_path: Path
) -> None:
    # A Hugging Face Mistral-7B directory has tokenizer.model but none of the release's added-token files.
    shutil.copy(TOKENIZER_DIR / "tokenizer.model", tmp_path / "tokenizer.model")
    (tmp_path / "config.json").write_text('{"model_type": "mistral"}')
    mistral = AnimeGamerTokenizer.from_checkpoint_dir(tmp_path)
    assert build_prompt(mistral, demo_lines[5], []).ids == release_prompt_ids(release, demo_lines[5])


def test_added_tokens_json_with_other_ids_is_refused(reference: Path, tmp_path: Path) -> None:
    shutil.copy(TOKENIZER_DIR / "tokenizer.model", tmp_path / "tokenizer.model")
    (tmp_path / "added_tokens.json").write_text(json.dumps({"<TURN>": 32000}))
    with pytest.raises(ValueError, match=r"<TURN>=32000"):
        AnimeGamerTokenizer.from_checkpoint_dir(tmp_path)


def test_checkpoint_dir_without_tokenizer_model_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.model.*Mistral-7B"):
        AnimeGamerTokenizer.from_checkpoint_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        AnimeGamerTokenizer.from_checkpoint_dir(tmp_path / "absent")
