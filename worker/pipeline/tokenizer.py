"""The AnimeGamer vocabulary: a base text vocabulary plus the 284 tokens the release adds.

The added tokens sit directly after the base vocabulary in a fixed order (ANIMEGAMER.md,
"Tokenizer"), so their ids follow from the base size alone: with Mistral's 32,000 pieces they
are exactly the release's ids, and with the byte-level ``ByteBase`` the tiny model gets the same
layout without any file. Prompts are built id by id (``prompt.py``) and states are read back by
id, so nothing here ever parses special-token strings out of text; ``SentencePieceBase.encode``
reproduces how the release's tokenizer encodes the text between added tokens, which makes the
id-built prompt equal to the release's token for token.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from worker.pipeline.config import NUM_FRAME_TOKENS

logger = logging.getLogger(__name__)

SPIECE_UNDERLINE = "\u2581"  # SentencePiece's word-boundary mark "▁"
MISTRAL_VOCAB_SIZE = 32000  # the base size the release's added ids (32000..32283) assume
TOKENIZER_FILE = "tokenizer.model"

STRENGTH_MIN, STRENGTH_MAX = -5, 5

# The tokens after the frame tokens, in id order; the Strength tokens are spliced in after "</frame>".
_MEDIA_TOKENS = ("<img>", "</img>", "<vid>", "</vid>", "<frame>", "</frame>")
_STATE_TOKENS = ("<visual>", "<ML>", "</ML>", "<SC>", "</SC>", "<ET>", "</ET>", "<ST>", "</ST>", "<TURN>", "</TURN>")


def frame_token_name(index: int) -> str:
    return f"<frame_{index:05d}>"


def strength_token_name(value: int) -> str:
    return f"<Strength_{value}>"


def added_token_names() -> list[str]:
    """The 284 added tokens in id order (offset 0 is the first id after the base vocabulary)."""
    frames = [frame_token_name(i) for i in range(NUM_FRAME_TOKENS)]
    strengths = [strength_token_name(v) for v in range(STRENGTH_MIN, STRENGTH_MAX + 1)]
    return [*frames, *_MEDIA_TOKENS, *strengths, *_STATE_TOKENS]


class BaseVocabulary(Protocol):
    """What ``AnimeGamerTokenizer`` needs from a base text vocabulary."""

    vocab_size: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]:
        """Ids of plain text as it appears in a prompt: right after an added token, no BOS."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteBase:
    """A file-free base vocabulary for the tiny model: three control ids, then the 256 UTF-8 bytes.

    Any text encodes losslessly, so the tiny model runs the same prompt code path as the full one.
    """

    unk_id, bos_id, eos_id = 0, 1, 2
    byte_offset = 3  # id = byte + 3
    num_bytes = 256

    def __init__(self, vocab_size: int = byte_offset + num_bytes) -> None:
        # A larger declared size stands in for Mistral's 32,000 when the full-size model runs on
        # random weights with no tokenizer file: the ids past the bytes exist but are never produced.
        if vocab_size < self.byte_offset + self.num_bytes:
            raise ValueError(f"a byte vocabulary needs at least {self.byte_offset + self.num_bytes} ids")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [self.byte_offset + b for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        # Control ids carry no text (as in SentencePiece); a broken UTF-8 sequence decodes to U+FFFD.
        data = bytes(i - self.byte_offset for i in ids if self.byte_offset <= i < self.byte_offset + self.num_bytes)
        return data.decode("utf-8", errors="replace")


_PIECES = re.compile(r" ?\w+| ?[^\w\s]|\s")  # a word or a mark with the space before it, or a lone space


def word_pieces(text: str) -> list[str]:
    """``text`` cut into the pieces ``WordBase`` looks up; they join back to ``text``, whatever it is."""
    return _PIECES.findall(text)


class WordBase(ByteBase):
    """The toy model's base vocabulary: ``ByteBase``'s ids, then one id per word of a closed word list.

    A small model trained on a CPU spends most of its first layers spelling words out of bytes; the toy world's
    instructions use a few dozen words, so each known word (with the space before it, as SentencePiece keeps its
    "▁") is one id and anything else falls back to its bytes. Encoding stays lossless: ``decode(encode(t)) == t``
    for any text. The word list travels with the model that was trained on it (the toy checkpoint's metadata).
    """

    def __init__(self, words: Sequence[str]) -> None:
        if len(set(words)) != len(words) or not all(words):
            raise ValueError("a word list needs distinct, non-empty words")
        super().__init__(self.byte_offset + self.num_bytes + len(words))
        self.words = tuple(words)
        first = self.byte_offset + self.num_bytes
        self._word_ids = {word: first + i for i, word in enumerate(self.words)}
        self._id_words = {i: word for word, i in self._word_ids.items()}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in word_pieces(text):
            word_id = self._word_ids.get(piece)
            ids += [word_id] if word_id is not None else super().encode(piece)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        parts: list[str] = []
        run: list[int] = []  # consecutive byte ids decode together, so multi-byte characters survive
        for token_id in ids:
            if token_id in self._id_words:
                parts += [super().decode(run), self._id_words[token_id]]
                run = []
            else:
                run.append(token_id)
        return "".join([*parts, super().decode(run)])


class SentencePieceBase:
    """Mistral's SentencePiece vocabulary (32,000 pieces; unk 0, BOS 1, EOS 2) from a ``tokenizer.model``.

    ``encode`` gives the ids the release's tokenizer gives for a span of plain text that directly
    follows an added token, which is where every piece of text in the prompt sits (right after
    ``<TURN>``). The release loads a slow ``LlamaTokenizer`` whose ``tokenizer_config.json`` says
    ``legacy: false``, and in that mode transformers (4.x ``LlamaTokenizer``; 5.x
    ``SentencePieceBackend``) does three things that plain SentencePiece does not:

    1. It switches SentencePiece's ``add_dummy_prefix`` off, so no "▁" is put before the span:
       ``<TURN>Character`` gives ``Character`` (15962), NOT ``▁Character`` (23471), which is what
       ``SentencePieceProcessor.encode`` with the file's own settings gives.
    2. A span that starts with a space is encoded behind a literal ``<unk>`` whose pieces are then
       dropped, so the leading space survives as a "▁" on the first piece.
    3. "▁" characters in the text are read as spaces.

    Splitting on added tokens puts no "▁" piece between two adjacent added tokens, and the "▁"
    that ``add_prefix_space`` may put before the whole string is dropped when the next token is
    special (every string the release encodes starts with ``<TURN>``, ``<img>`` or ``<ML>``). So a
    prompt assembled id by id from this ``encode`` equals the release's ids exactly
    (tests/pipeline/test_tokenizer_parity.py checks it against transformers itself).
    """

    def __init__(self, model_file: str | Path) -> None:
        path = Path(model_file)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no such file; expected the release's SentencePiece tokenizer.model "
                "(the Mistral-7B vocabulary of 32,000 pieces)"
            )
        import sentencepiece  # only the full model needs it

        try:
            from sentencepiece import sentencepiece_model_pb2
        except ImportError as exc:  # the generated module imports google.protobuf
            raise ImportError(
                "reading tokenizer.model the way the release's tokenizer does needs protobuf: pip install protobuf"
            ) from exc

        # Item 1 of the class docstring: the same model with the dummy prefix switched off.
        proto = sentencepiece_model_pb2.ModelProto.FromString(path.read_bytes())
        proto.normalizer_spec.add_dummy_prefix = False
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=proto.SerializeToString())
        self.vocab_size: int = self._sp.get_piece_size()
        self.unk_id: int = self._sp.unk_id()
        self.bos_id: int = self._sp.bos_id()
        self.eos_id: int = self._sp.eos_id()
        # Item 2: the text put before a span that starts with a space, and how many pieces it makes.
        self._guard = self._sp.id_to_piece(self.unk_id)
        self._guard_length = len(self._sp.encode(self._guard))

    def encode(self, text: str) -> list[int]:
        """Plain text as the release tokenizes it after an added token (see the class docstring)."""
        text = text.replace(SPIECE_UNDERLINE, " ")
        if text.startswith(" "):
            return list(self._sp.encode(self._guard + text, out_type=int))[self._guard_length :]
        return list(self._sp.encode(text, out_type=int))

    def decode(self, ids: Sequence[int]) -> str:
        # Without the dummy prefix nothing is stripped on decoding, so text (without "▁") round-trips.
        return self._sp.decode(list(ids))


def _config_vocab_size(config_file: Path) -> int | None:
    """The base vocabulary a Hugging Face directory's model was built for (None: no config to compare)."""
    try:
        return int(json.loads(config_file.read_text(encoding="utf-8"))["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class AnimeGamerTokenizer:
    """A base vocabulary plus the AnimeGamer tokens, which take ids ``base.vocab_size`` onward.

    Args:
        base (`BaseVocabulary`): the text vocabulary, e.g. `ByteBase()` or `SentencePieceBase(path)`.
    """

    def __init__(self, base: BaseVocabulary) -> None:
        self.base = base
        self.base_vocab_size = base.vocab_size
        self._names = added_token_names()
        self._ids = {name: self.base_vocab_size + offset for offset, name in enumerate(self._names)}
        self._ids["<s>"], self._ids["</s>"] = base.bos_id, base.eos_id
        self._strength_zero = self._ids[strength_token_name(0)]

    @classmethod
    def tiny(cls) -> AnimeGamerTokenizer:
        return cls(ByteBase())

    @classmethod
    def from_sentencepiece(cls, path: str | Path) -> AnimeGamerTokenizer:
        """The vocabulary of a SentencePiece ``tokenizer.model`` file plus the AnimeGamer tokens."""
        return cls(SentencePieceBase(path))

    @classmethod
    def from_checkpoint_dir(cls, directory: str | Path) -> AnimeGamerTokenizer:
        """The tokenizer of a Hugging Face Mistral-7B directory (or the release's tokenizer folder).

        Only ``tokenizer.model`` is read: the added tokens' ids follow from the base size, so a
        plain Mistral checkpoint is enough. Where the folder also holds the release's
        ``added_tokens.json``, its ids are checked against ours so a foreign folder fails here and
        not as garbage states three layers later.
        """
        path = Path(directory)
        if path.is_file() and path.name == TOKENIZER_FILE:
            path = path.parent
        model_file = path / TOKENIZER_FILE
        if not model_file.is_file():
            where = "no such directory" if not path.exists() else "that directory has no tokenizer.model"
            raise FileNotFoundError(
                f"{model_file}: {where}; expected a Hugging Face Mistral-7B-Instruct-v0.1 directory "
                "(or the release's animegamer_tokenizer folder) holding its SentencePiece tokenizer.model"
            )
        tokenizer = cls.from_sentencepiece(model_file)
        expected = _config_vocab_size(path / "config.json")
        if expected is not None and tokenizer.base_vocab_size != expected:
            raise ValueError(
                f"{model_file} has {tokenizer.base_vocab_size} pieces but {path / 'config.json'} says vocab_size "
                f"{expected}; the tokenizer and the model must come from the same checkpoint "
                f"(Mistral-7B-Instruct-v0.1: {MISTRAL_VOCAB_SIZE})"
            )
        tokenizer._check_added_tokens(path / "added_tokens.json")
        return tokenizer

    def _check_added_tokens(self, added_tokens_file: Path) -> None:
        if not added_tokens_file.is_file():
            return
        try:
            listed = json.loads(added_tokens_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{added_tokens_file}: not readable JSON ({exc})") from exc
        wrong = {name: i for name, i in listed.items() if self._ids.get(name) != i}
        if wrong:
            shown = ", ".join(f"{name}={i}" for name, i in list(wrong.items())[:5])
            raise ValueError(f"{added_tokens_file} gives ids that differ from the release's layout: {shown}")

    @property
    def vocab_size(self) -> int:
        return self.base_vocab_size + len(self._names)

    @property
    def bos_id(self) -> int:
        return self.base.bos_id

    @property
    def eos_id(self) -> int:
        return self.base.eos_id

    @property
    def strength_ids(self) -> list[int]:
        """The 11 Strength ids, in value order -5..5 (index + STRENGTH_MIN is the value)."""
        return [self.strength_id(v) for v in range(STRENGTH_MIN, STRENGTH_MAX + 1)]

    def token_id(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise KeyError(
                f"{name!r} is not an AnimeGamer token; expected one of <s>, </s>, <frame_00000>..<frame_00255>, "
                f"<Strength_-5>..<Strength_5>, {', '.join(_MEDIA_TOKENS + _STATE_TOKENS)}"
            ) from None

    def token_name(self, token_id: int) -> str:
        """The name of an added token (or BOS/EOS); ``KeyError`` for plain text ids."""
        offset = token_id - self.base_vocab_size
        if 0 <= offset < len(self._names):
            return self._names[offset]
        if token_id == self.bos_id:
            return "<s>"
        if token_id == self.eos_id:
            return "</s>"
        raise KeyError(f"id {token_id} is a base text id, not a named token")

    def frame_id(self, index: int) -> int:
        if not 0 <= index < NUM_FRAME_TOKENS:
            raise ValueError(f"frame index must be 0..{NUM_FRAME_TOKENS - 1}, got {index}")
        return self.base_vocab_size + index

    def strength_id(self, value: int) -> int:
        if not STRENGTH_MIN <= value <= STRENGTH_MAX:
            raise ValueError(f"strength must be {STRENGTH_MIN}..{STRENGTH_MAX}, got {value}")
        return self._strength_zero + value

    def strength_value(self, token_id: int) -> int | None:
        value = token_id - self._strength_zero
        return value if STRENGTH_MIN <= value <= STRENGTH_MAX else None

    def encode(self, text: str) -> list[int]:
        """Plain text to base ids as the release encodes text that follows an added token, without BOS.

        Token names in ``text`` are NOT turned into added ids (the release's string-built prompt
        would split them out; here a player's text can never become a control token).
        """
        return self.base.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Base ids through the base vocabulary, added tokens as their names, joined without spaces."""
        parts: list[str] = []
        run: list[int] = []  # consecutive base ids decode together, so multi-byte characters survive
        for token_id in ids:
            if token_id >= self.base_vocab_size:
                if run:
                    parts.append(self.base.decode(run))
                    run = []
                parts.append(self.token_name(token_id))
            else:
                run.append(token_id)
        if run:
            parts.append(self.base.decode(run))
        return "".join(parts)
