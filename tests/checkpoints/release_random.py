"""A release tree of any size with random weights, written tensor by tensor, for measuring the loader at full size.

``release_tree.py`` writes a tiny tree from modules whose weights the tests know; at the published sizes that would
mean holding an 18 GB model in memory to write it. This writer never builds a model: it lists the files' tensors
(names and shapes) from the loaders' own tables, so it cannot drift from what they read, and fills each with
random bf16 values only when it is written:

- the Mistral directory's tensors are ``AnimeGamerMLLM``'s (built on the meta device) with the base vocabulary's
  rows, as ``checkpoints.mllm`` checks them; the MLLM file's keys are the required ones of ``release_slots``;
- the decoder's SAT keys are the sources of ``checkpoints.decoder``'s conversion plan;
- the VAE's SAT keys are ``AutoencoderKLCogVideoX``'s (meta device) through ``checkpoints.vae``'s renaming.

What is held at once: one safetensors shard of the Mistral base (``shard_bytes``), or one whole ``.pt`` file
(``torch.save`` takes a dict; the decoder's is the largest, 3.4 GB at the published sizes).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from tests.checkpoints.release_mllm import hf_config_json
from tests.checkpoints.release_sat import RELEASE_LORA_RANK, save_release_decoder
from tests.checkpoints.release_tree import train_tokenizer
from worker.pipeline.checkpoints.decoder import _plan
from worker.pipeline.checkpoints.layout import CheckpointLayout
from worker.pipeline.checkpoints.mllm import LORA_RANK, release_slots
from worker.pipeline.checkpoints.vae import _sat_key
from worker.pipeline.config import PipelineConfig
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.tokenizer import added_token_names
from worker.pipeline.vae import build_vae

Shapes = dict[str, tuple[int, ...]]
GIB = 2**30
COMPLETE = "complete.json"  # written last: a tree without it is rewritten
DTYPE = torch.bfloat16
# The release's Mistral-7B-Instruct-v0.1 tokenizer (the parity tests' copy), used when its size is the one asked for.
REFERENCE_TOKENIZER = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "animegamer_tokenizer"


@dataclass(frozen=True)
class TreePlan:
    """Every file of the tree and its tensors' shapes, known before anything is written."""

    config: PipelineConfig
    characters: tuple[str, ...]
    base: Shapes  # the Mistral directory's safetensors
    mllm: Shapes  # one character's pytorch_model.bin
    decoder: Shapes  # one character's SAT module state
    vae: Shapes  # 3d-vae.pt's state_dict

    @staticmethod
    def bytes_of(shapes: Shapes) -> int:
        return sum(_numel(shape) for shape in shapes.values()) * DTYPE.itemsize

    @property
    def total_bytes(self) -> int:
        per_character = self.bytes_of(self.mllm) + self.bytes_of(self.decoder)
        return self.bytes_of(self.base) + self.bytes_of(self.vae) + len(self.characters) * per_character

    def describe(self) -> dict[str, object]:
        """What a finished tree records, so a later run can tell whether it may reuse it."""
        described = {"config": asdict(self.config), "characters": list(self.characters), "dtype": str(DTYPE)}
        return json.loads(json.dumps(described))  # tuples as lists, as a marker file reads back


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def plan_tree(config: PipelineConfig, characters: tuple[str, ...]) -> TreePlan:
    """The tensors of every file for ``config``'s sizes, from the loaders' own key tables."""
    mllm_cfg, dec_cfg = config.mllm, config.decoder
    vocab = mllm_cfg.base_vocab_size + len(added_token_names())
    with torch.device("meta"):
        mllm = AnimeGamerMLLM(mllm_cfg, vocab, dec_cfg.hidden_size)
        vae = build_vae(config.vae)
    targets = {key: tuple(t.shape) for key, t in mllm.state_dict().items()}

    # 1. The Mistral directory: the LLM's tensors, the embedding and head at the base vocabulary
    base_rows = (mllm_cfg.base_vocab_size, mllm_cfg.hidden_size)
    base = {
        key.removeprefix("llm."): base_rows if key.endswith(("embed_tokens.weight", "lm_head.weight")) else shape
        for key, shape in targets.items()
        if key.startswith("llm.")
    }

    # 2. The MLLM file: what the release's trainer saved (trained values and LoRA pairs), no frozen base copies
    mllm_file: Shapes = {}
    for key, slot in release_slots(targets).items():
        if not slot.required:
            continue
        target = targets[slot.target]
        if slot.role == "lora_A":
            mllm_file[key] = (LORA_RANK, target[1])  # [r, in]
        elif slot.role == "lora_B":
            mllm_file[key] = (target[0], LORA_RANK)  # [out, r]
        else:
            mllm_file[key] = target

    # 3. The decoder and the VAE: the SAT names the conversions read
    decoder = {key: shape for rule in _plan(dec_cfg, RELEASE_LORA_RANK) for key, shape in rule.sources().items()}
    levels = len(config.vae.block_out_channels)
    vae_state = {_sat_key(key, levels): tuple(t.shape) for key, t in vae.state_dict().items()}
    return TreePlan(config, characters, base, mllm_file, decoder, vae_state)


class _Random:
    """Finite bf16 values fast: slices of one random pool, each tensor from its own offset (about 1 GB/s)."""

    POOL = 1 << 24

    def __init__(self, seed: int) -> None:
        self._gen = torch.Generator().manual_seed(seed)
        self._pool = (torch.randn(self.POOL, generator=self._gen) * 0.02).to(DTYPE)

    def tensor(self, shape: tuple[int, ...]) -> torch.Tensor:
        out = torch.empty(shape, dtype=DTYPE)
        flat = out.view(-1)
        start = int(torch.randint(self.POOL, (), generator=self._gen))
        done = 0
        while done < flat.numel():
            n = min(flat.numel() - done, self.POOL - start)
            flat[done : done + n].copy_(self._pool[start : start + n])
            done, start = done + n, 0
        return out

    def state(self, shapes: Shapes) -> dict[str, torch.Tensor]:
        return {key: self.tensor(shape) for key, shape in shapes.items()}


def _shards(shapes: Shapes, shard_bytes: int) -> list[list[str]]:
    """Keys in order, cut into shards of at most ``shard_bytes`` (a larger tensor gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, shape in shapes.items():
        nbytes = _numel(shape) * DTYPE.itemsize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    return shards


def _write_mistral(plan: TreePlan, folder: Path, fill: _Random, shard_bytes: int, tokenizer: Path | None) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = plan.config
    with torch.device("meta"):
        meta = AnimeGamerMLLM(cfg.mllm, cfg.mllm.base_vocab_size + len(added_token_names()), cfg.decoder.hidden_size)
    (folder / "config.json").write_text(json.dumps(hf_config_json(meta), indent=2))
    write_tokenizer(folder, cfg.mllm.base_vocab_size, tokenizer)

    shards = _shards(plan.base, shard_bytes)
    weight_map: dict[str, str] = {}
    for i, keys in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(fill.state({key: plan.base[key] for key in keys}), folder / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, name))
    index = {"metadata": {"total_size": plan.bytes_of(plan.base)}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tokenizer(folder: Path, vocab_size: int, source: Path | None = None) -> None:
    """``tokenizer.model`` with ``vocab_size`` pieces: ``source``'s when it has that many, else a trained one.

    A trained model learns a few hundred pieces from the toy sentences and pads the rest with placeholder symbols,
    so the full size (32,000) needs no download.
    """
    import sentencepiece as spm

    if source is not None:
        model = source / "tokenizer.model" if source.is_dir() else source
        if model.is_file() and spm.SentencePieceProcessor(model_file=str(model)).vocab_size() == vocab_size:
            shutil.copyfile(model, folder / "tokenizer.model")
            return
    learned = min(vocab_size, 300)
    train_tokenizer(folder, learned, padding=[f"<unused_{i:05d}>" for i in range(vocab_size - learned)])


def write_random_release(
    root: Path,
    plan: TreePlan,
    *,
    seed: int = 0,
    shard_bytes: int = 2 * GIB,
    tokenizer: Path | None = REFERENCE_TOKENIZER,
) -> bool:
    """Write ``plan``'s tree under ``root`` (random bf16 weights); False when a finished one is there already."""
    marker = root / COMPLETE
    if marker.is_file() and json.loads(marker.read_text()) == plan.describe():
        return False
    if marker.exists():
        marker.unlink()
    fill = _Random(seed)
    layout = CheckpointLayout(root, plan.characters[0])
    _write_mistral(plan, layout.mistral_dir, fill, shard_bytes, tokenizer)
    for character in plan.characters:
        layout = CheckpointLayout(root, character)
        layout.mllm_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(fill.state(plan.mllm), layout.mllm_file)
        save_release_decoder(fill.state(plan.decoder), layout.decoder_dir)
    layout.vae_file.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": fill.state(plan.vae)}, layout.vae_file)
    marker.write_text(json.dumps(plan.describe(), indent=2))
    return True


def files_of(root: Path, characters: tuple[str, ...]) -> Iterator[Path]:
    """The tree's weight files (for sizes on disk)."""
    layout = CheckpointLayout(root, characters[0])
    yield from sorted(layout.mistral_dir.glob("*.safetensors"))
    for character in characters:
        layout = CheckpointLayout(root, character)
        yield layout.mllm_file
        yield layout.decoder_file()
    yield layout.vae_file


def tiny_plan(config: PipelineConfig, characters: tuple[str, ...] = ("Qiqi",), vocab: int = 300) -> TreePlan:
    """``config`` with the base vocabulary a trained tiny tokenizer has."""
    return plan_tree(replace(config, mllm=replace(config.mllm, base_vocab_size=vocab)), characters)
