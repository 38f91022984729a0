from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from worker.pipeline.config import tiny
from worker.pipeline.tokenizer import AnimeGamerTokenizer, ByteBase, SentencePieceBase, WordBase

REFERENCE = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "animegamer_tokenizer"


class MistralSizedBase:
    """A base vocabulary of Mistral's size; the added ids depend on nothing else."""

    vocab_size, bos_id, eos_id = 32000, 1, 2

    def encode(self, text: str) -> list[int]:
        return [3 + b for b in text.encode()]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i - 3 for i in ids).decode()


@pytest.fixture
def mistral_sized() -> AnimeGamerTokenizer:
    return AnimeGamerTokenizer(MistralSizedBase())


@pytest.fixture
def reference_dir() -> Path:
    if not (REFERENCE / "tokenizer.model").is_file():
        pytest.skip(f"the release's tokenizer files are not at {REFERENCE} (../shared is absent)")
    return REFERENCE


def test_byte_base_has_three_control_ids_then_the_256_bytes() -> None:
    base = ByteBase()
    assert (base.unk_id, base.bos_id, base.eos_id, base.vocab_size) == (0, 1, 2, 259)
    assert base.encode("A\u00e9") == [3 + 0x41, 3 + 0xC3, 3 + 0xA9]


def test_byte_base_round_trips_any_text() -> None:
    base = ByteBase()
    text = "Character: Qiqi; Motion: gently fly \u2728 over \u6674\u308c."
    assert base.decode(base.encode(text)) == text


def test_word_base_gives_a_known_word_one_id_after_the_bytes() -> None:
    base = WordBase(["Character", ":", " Qiqi", " fly"])
    assert base.vocab_size == 259 + 4
    assert base.encode("Character: Qiqi fly") == [259, 260, 261, 262]


def test_word_base_spells_unknown_words_in_bytes_and_round_trips_any_text() -> None:
    base = WordBase(["Character", ":", " Qiqi", " fly"])
    text = "Character:  Qiqi flies \u2728 over \u6674\u308c.\tfly"
    ids = base.encode(text)
    assert ids[:2] == [259, 260] and base.encode(" flies") == ByteBase().encode(" flies")
    assert base.decode(ids) == text


def test_word_base_refuses_a_repeated_word() -> None:
    with pytest.raises(ValueError, match="distinct, non-empty words"):
        WordBase([" fly", " fly"])


def test_added_tokens_take_the_release_ids_after_a_32000_base(mistral_sized: AnimeGamerTokenizer) -> None:
    t = mistral_sized.token_id
    assert mistral_sized.vocab_size == 32284
    assert (t("<frame_00000>"), t("<frame_00255>")) == (32000, 32255)
    assert (t("<img>"), t("</img>"), t("<vid>"), t("</vid>"), t("<frame>"), t("</frame>")) == tuple(range(32256, 32262))
    assert (t("<Strength_-5>"), t("<Strength_0>"), t("<Strength_5>")) == (32262, 32267, 32272)
    assert t("<visual>") == 32273
    names = ["<ML>", "</ML>", "<SC>", "</SC>", "<ET>", "</ET>", "<ST>", "</ST>", "<TURN>", "</TURN>"]
    assert [t(n) for n in names] == list(range(32274, 32284))


def test_strength_ids_are_in_value_order_and_map_back(mistral_sized: AnimeGamerTokenizer) -> None:
    assert mistral_sized.strength_ids == list(range(32262, 32273))
    assert [mistral_sized.strength_value(i) for i in mistral_sized.strength_ids] == list(range(-5, 6))
    assert mistral_sized.strength_id(-2) == 32265


def test_strength_value_is_none_for_other_ids(mistral_sized: AnimeGamerTokenizer) -> None:
    assert mistral_sized.strength_value(32261) is None
    assert mistral_sized.strength_value(32273) is None
    assert mistral_sized.strength_value(5) is None


def test_frame_id_and_token_name_agree(mistral_sized: AnimeGamerTokenizer) -> None:
    assert mistral_sized.frame_id(225) == 32225
    assert mistral_sized.token_name(32225) == "<frame_00225>"
    assert mistral_sized.token_name(32283) == "</TURN>"


def test_unknown_token_name_raises_a_key_error_naming_it(mistral_sized: AnimeGamerTokenizer) -> None:
    with pytest.raises(KeyError, match="<Strength_6>"):
        mistral_sized.token_id("<Strength_6>")


def test_out_of_range_strength_and_frame_are_refused(mistral_sized: AnimeGamerTokenizer) -> None:
    with pytest.raises(ValueError, match="strength"):
        mistral_sized.strength_id(6)
    with pytest.raises(ValueError, match="frame"):
        mistral_sized.frame_id(256)


def test_tiny_tokenizer_matches_the_tiny_config_vocabulary() -> None:
    tokenizer = AnimeGamerTokenizer.tiny()
    assert tokenizer.base_vocab_size == tiny().mllm.base_vocab_size
    assert tokenizer.vocab_size == 259 + 284
    assert (tokenizer.bos_id, tokenizer.eos_id) == (1, 2)


def test_encode_treats_token_names_as_plain_text() -> None:
    tokenizer = AnimeGamerTokenizer.tiny()
    ids = tokenizer.encode("<ML>")
    assert len(ids) == 4
    assert all(i < tokenizer.base_vocab_size for i in ids)


def test_decode_renders_added_tokens_by_name_without_spaces() -> None:
    tokenizer = AnimeGamerTokenizer.tiny()
    t = tokenizer.token_id
    ids = [t("<ML>"), tokenizer.strength_id(3), *tokenizer.encode("h\u00e9"), t("</ML>")]
    assert tokenizer.decode(ids) == "<ML><Strength_3>h\u00e9</ML>"


def test_missing_sentencepiece_file_raises_file_not_found_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "tokenizer.model"
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.model.*SentencePiece"):
        AnimeGamerTokenizer.from_sentencepiece(missing)


def test_sentencepiece_base_is_mistral_vocabulary(reference_dir: Path) -> None:
    base = SentencePieceBase(reference_dir / "tokenizer.model")
    assert (base.vocab_size, base.unk_id, base.bos_id, base.eos_id) == (32000, 0, 1, 2)
    # "Character" (15962), not "▁Character" (23471): text in the prompt always follows an added token,
    # and the release's non-legacy tokenizer puts no dummy-prefix "▁" there (see SentencePieceBase).
    assert base.encode("Character: Qiqi") == [15962, 28747, 1186, 26325, 28710]
    assert base.encode(" Character") == [23471]
    assert base.decode(base.encode("Motion: gently fly on broomstick")) == "Motion: gently fly on broomstick"


def test_release_tokenizer_ids_equal_the_release_added_tokens(reference_dir: Path) -> None:
    tokenizer = AnimeGamerTokenizer.from_sentencepiece(reference_dir / "tokenizer.model")
    added = json.loads((reference_dir / "added_tokens.json").read_text())
    assert tokenizer.vocab_size == 32284
    assert {name: tokenizer.token_id(name) for name in added} == added
