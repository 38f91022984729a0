"""A complete tiny checkpoint tree in the release's layout: Mistral directory with its SentencePiece
tokenizer, MLLM-<Character>, VDM_Decoder-<Character>, vae/3d-vae.pt; each from a module of known weights."""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from pathlib import Path

import sentencepiece as spm
import torch

from game.instruction import ADVERBS, TIMES
from tests.checkpoints.release_mllm import write_release_mllm
from tests.checkpoints.release_sat import randomize_on_grid_, write_release_decoder, write_release_vae
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


def train_tokenizer(folder: Path, vocab_size: int = 300) -> int:
    """A small SentencePiece model with Llama's special ids (unk 0, BOS 1, EOS 2), as Mistral's is."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        byte_fallback=True,
        minloglevel=2,
    )
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return vocab_size


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
    return TinyRelease(root, config, mllm, decoder)
