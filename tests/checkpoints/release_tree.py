"""A complete tiny checkpoint tree in the release's layout: Mistral directory with its SentencePiece
tokenizer, MLLM-<Character>, VDM_Decoder-<Character> (the frozen T5 and OpenCLIP encoders inside, as the release's),
vae/3d-vae.pt and the T5 tokenizer's directory; each from a module of known weights."""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from pathlib import Path

import sentencepiece as spm
import torch
from transformers import ByT5Tokenizer

from game.instruction import ADVERBS, TIMES
from tests.checkpoints.release_mllm import write_release_mllm
from tests.checkpoints.release_sat import randomize_on_grid_, write_release_decoder, write_release_vae
from training.frozen_encoders import T5_TOKENIZER_DIR
from worker.pipeline.checkpoints.layout import CheckpointLayout
from worker.pipeline.config import PipelineConfig, tiny
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.tokenizer import added_token_names
from worker.pipeline.vae import build_vae

SENTENCES = [
    f"Character: {who}; Motion: {adverb} {action}; Background: {time} {place}."
    for who in ("Qiqi", "Sosuke")
    for adverb in sorted(ADVERBS)
    for action in ("fly on broomstick", "sit on railing", "turn head", "lie down", "hold broom", "run", "wave")
    for time in sorted(TIMES)[:3]
    for place in ("sky", "countryside", "town", "grass", "street", "bedroom")
]


@dataclass(frozen=True)
class TinyRelease:
    root: Path
    config: PipelineConfig
    mllm: AnimeGamerMLLM
    decoder: AnimeGamerDecoder


def train_tokenizer(folder: Path, vocab_size: int = 300, padding: list[str] | None = None) -> int:
    """A small SentencePiece model with Llama's special ids (unk 0, BOS 1, EOS 2), as Mistral's is.

    ``padding`` symbols come on top of the ``vocab_size`` learned pieces, to reach a large vocabulary's size.
    """
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES),
        model_writer=model,
        vocab_size=vocab_size + len(padding or ()),
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        byte_fallback=True,
        minloglevel=2,
        user_defined_symbols=padding or [],
    )
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return vocab_size + len(padding or ())


def write_tiny_release(root: Path, characters: tuple[str, ...] = ("Qiqi",), seed: int = 0) -> TinyRelease:
    layout = CheckpointLayout(root, characters[0])
    layout.mistral_dir.mkdir(parents=True)
    vocab = train_tokenizer(layout.mistral_dir)
    base = tiny()
    config = replace(base, name="tiny-release", mllm=replace(base.mllm, base_vocab_size=vocab), label="")
    torch.manual_seed(seed)
    mllm = AnimeGamerMLLM(config.mllm, vocab + len(added_token_names()), config.decoder.hidden_size)
    decoder = randomize_on_grid_(AnimeGamerDecoder.from_pipeline_config(config.decoder), seed)
    vae = build_vae(config.vae)
    for character in characters:
        write_release_mllm(mllm, root, character=character, seed=seed)
        write_release_decoder(decoder, CheckpointLayout(root, character).decoder_dir, seed=seed)
    layout.vae_file.parent.mkdir(parents=True, exist_ok=True)
    write_release_vae(vae, layout.vae_file)
    ByT5Tokenizer().save_pretrained(root / T5_TOKENIZER_DIR)  # T5's, for training a character; no file to learn
    return TinyRelease(root, config, mllm, decoder)


def write_two_characters(root: Path) -> TinyRelease:
    """Qiqi as ``write_tiny_release`` writes her, and Sosuke over the same Mistral base, as the release ships them:
    his own LoRA, norms, embedding rows, resamplers (only the trainable tensors in his file) and decoder."""
    release = write_tiny_release(root, ("Qiqi",), seed=0)
    torch.manual_seed(1)
    other = AnimeGamerMLLM(release.config.mllm, release.mllm.llm.config.vocab_size, release.config.decoder.hidden_size)
    write_release_mllm(other, root, character="Sosuke", seed=1, trainable_only=True, write_base=False)
    decoder = randomize_on_grid_(AnimeGamerDecoder.from_pipeline_config(release.config.decoder), 1)
    write_release_decoder(decoder, CheckpointLayout(root, "Sosuke").decoder_dir, seed=1)
    return release
