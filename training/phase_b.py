"""Phase (b): the MLLM learns to predict a turn's representation (regression) and its states (language modelling).

Every turn of a training episode becomes the prompt inference builds (``worker.pipeline.prompt.build_prompt``): up
to ``history_window - 1`` past turns, each with its instruction, its representation in its frame span and its
states, then the current instruction open at ``<ML>``. Two losses, as in the paper:

- regression: the representation pass (frame spans bidirectional, the last 226 final states through the output
  resampler, exactly ``AnimeGamerMLLM.predict_representation``) against the frozen phase-(a) encoder's
  representation of the turn's true clip, by MSE;
- language modelling: the turn's true states appended (teacher forcing), cross-entropy of the four Strength tokens
  at the positions the state pass reads them, under the plain causal mask the state pass uses.

Past turns carry the encoder's representations of their true clips for the first steps. At inference they carry the
MLLM's own predictions instead, which differ (measured: cosine 0.67 to the truth, 0.61 of its norm), and a model that
only ever saw true pasts does worse with its own than with none. So the last ``own_history`` share of the steps
(scheduled sampling) feed past turns what the model itself predicted for them, turn after turn as inference does
(``own_predictions``), from the model as it stood when that stage began; the target stays the true clip's
representation. Prompts are padded on the left so every prompt ends at the same position and the readout is one
slice; position ids skip the padding, so each row computes what it would alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from game.contract import HistoryTurn
from game.state import StateDeltas
from training.config import ToyModelConfig, TrainConfig
from training.dataset import DatasetError, Episode, load_toyworld, split
from training.encoder import ClipEncoder, instruction_bytes
from training.loop import OnStep, TrainResult, train
from training.phase_a import ClipSet, build_initial_vae
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.prompt import build_prompt, state_block
from worker.pipeline.tokenizer import AnimeGamerTokenizer

logger = logging.getLogger(__name__)

OUTPUTS = ("mllm.pt", "phase_b.json")
SUFFIX = (
    10  # teacher-forced ids after <ML>: Strength, </ML>, <SC>, Strength, </SC>, <ET>, Strength, </ET>, <ST>, Strength
)
READ_AT = (-11, -8, -5, -2)  # where each Strength is predicted: at <ML>, <SC>, <ET>, <ST> (from the sequence's end)
NO_HISTORY_STAGE = "no_history"  # the first steps, on prompts without past turns, in their own folder
TEACHER_STAGE = "teacher"  # the steps on true pasts, in their own folder, before the steps on the model's own


@dataclass(frozen=True)
class Stage:
    folder: str  # under phase (b)'s folder; "" for the last stage, whose state is the phase's own
    steps: int
    pasts: str  # what past turns carry: "none" (no past turns at all), "true" (the encoder's), "own" (its own)
    description: str


def stages(config: TrainConfig) -> list[Stage]:
    """Phase (b)'s steps in order: without past turns, with true pasts, with its own (the empty ones left out).

    Prompts without past turns are a third as long as those with two, so the first stage learns what the
    instruction says (the representation and the states) at a third of the cost; the next ones learn to read the
    past, first the true one, then (scheduled sampling) what the model itself predicted."""
    alone, own = config.no_history_steps, config.own_history_steps
    planned = [
        Stage(NO_HISTORY_STAGE, alone, "none", "phase b, no history"),
        Stage(TEACHER_STAGE, config.steps - alone - own, "true", "phase b"),
        Stage("", own, "own", "phase b, own history"),
    ]
    kept = [stage for stage in planned if stage.steps]
    return [*kept[:-1], replace(kept[-1], folder="")]


class PhaseError(RuntimeError):
    """An earlier phase's outputs are missing or from another config; the message names the file."""


def read_phase(folder: Path, phase: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The finished phase's metadata, after checking all its files are there."""
    for name in names:
        if not (folder / name).is_file():
            raise PhaseError(f"{folder / name} is missing: run `animegamer train {phase}` (or `train all`) first.")
    return json.loads((folder / names[-1]).read_text())


def check_sizes(meta: dict[str, Any], expected: dict[str, object], where: Path) -> None:
    saved = meta.get("sizes", {})
    differ = sorted(k for k in expected if saved.get(k) != expected[k])
    if differ:
        detail = "; ".join(f"{k}: file {saved.get(k)!r}, config {expected[k]!r}" for k in differ)
        raise PhaseError(f"{where} was trained with other sizes ({detail}).")


@torch.no_grad()
def encode_representations(encoder: ClipEncoder, clips: ClipSet, max_bytes: int, batch: int = 16) -> torch.Tensor:
    """The frozen encoder's representation of every clip, from the latents ``clips.encode`` made: `(N, 226, D)`."""
    encoder.eval()
    out = []
    for start in range(0, len(clips), batch):
        latents = clips.latents[start : start + batch]  # (b, F, C, h, w)
        ids = instruction_bytes(clips.instructions[start : start + batch], max_bytes)
        out.append(encoder(latents, ids))
    return torch.cat(out) if out else torch.empty(0)


@dataclass(frozen=True)
class TurnSample:
    clip: int  # the turn's clip, an index into the ClipSet of the same episodes
    history: tuple[int, ...]  # its past turns' clips, oldest first
    turn: int = 0  # its place in the episode: own_predictions predicts turn k after every turn before it


def turn_samples(episodes: tuple[Episode, ...], window: int) -> list[TurnSample]:
    """Every turn with its last ``window - 1`` past turns, in ClipSet order."""
    samples, first = [], 0
    for episode in episodes:
        for k in range(len(episode.clips)):
            samples.append(TurnSample(first + k, tuple(range(first + max(0, k - window + 1), first + k)), k))
        first += len(episode.clips)
    return samples


def deltas_of(episodes: tuple[Episode, ...]) -> list[StateDeltas]:
    return [clip.deltas for episode in episodes for clip in episode.clips]


class TurnSet(Dataset):
    def __init__(self, samples: list[TurnSample]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> TurnSample:
        return self.samples[i]


@dataclass
class PromptCollate:
    """Turns -> a left-padded batch of full sequences (prompt + teacher-forced states) and their targets."""

    tokenizer: AnimeGamerTokenizer
    instructions: list[str]
    deltas: list[StateDeltas]
    representations: torch.Tensor  # (N, 226, D), the encoder's: the targets
    num_query_tokens: int
    history_representations: torch.Tensor | None = None  # (N, 226, D) what past turns carry; None: the targets
    slot_weights: torch.Tensor | None = None  # (N, 226): each slot's weight in the regression; None: all 1

    def __call__(self, samples: list[TurnSample]) -> dict[str, Any]:
        sequences, spans = [], []
        for sample in samples:
            history = [
                HistoryTurn(instruction=self.instructions[i], representation=b"", deltas=self.deltas[i])
                for i in sample.history
            ]
            prompt = build_prompt(self.tokenizer, self.instructions[sample.clip], history, self.num_query_tokens)
            sequences.append(prompt.ids + state_block(self.tokenizer, self.deltas[sample.clip])[1 : 1 + SUFFIX])
            spans.append(prompt.frame_spans)
        length = max(len(s) for s in sequences)
        ids = torch.zeros(len(samples), length, dtype=torch.long)  # (B, L); padding id 0 is never attended to
        valid = torch.zeros(len(samples), length, dtype=torch.bool)
        history_slots: list[tuple[int, int]] = []  # (row, start) of each past turn's frame span
        history_clips: list[int] = []
        frame_spans: list[list[tuple[int, int]]] = []
        for row, (sequence, row_spans, sample) in enumerate(zip(sequences, spans, samples, strict=True)):
            pad = length - len(sequence)
            ids[row, pad:] = torch.tensor(sequence)
            valid[row, pad:] = True
            shifted = [(start + pad, end + pad) for start, end in row_spans]
            frame_spans.append(shifted)
            history_slots += [(row, start) for start, _ in shifted[:-1]]
            history_clips += list(sample.history)
        targets = ids[:, [length + p + 1 for p in READ_AT]]  # (B, 4): the Strength ids that follow
        past = self.representations if self.history_representations is None else self.history_representations
        return {
            "ids": ids,
            "valid": valid,
            "frame_spans": frame_spans,
            "history_slots": history_slots,
            "history": past[history_clips],  # (M, 226, D)
            "target_representation": self.representations[[s.clip for s in samples]],  # (B, 226, D)
            "slot_weights": None if self.slot_weights is None else self.slot_weights[[s.clip for s in samples]],
            "target_states": targets,
        }


def attention_masks(
    valid: torch.Tensor, frame_spans: list[list[tuple[int, int]]], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive masks `(B, 1, L, L)`: causal over real tokens, and the same with each frame span bidirectional."""
    B, L = valid.shape
    causal = torch.ones(L, L, dtype=torch.bool, device=valid.device).tril()[None] & valid[:, None, :]  # (B, L, L)
    causal |= torch.eye(L, dtype=torch.bool, device=valid.device)[None]  # a padding row sees itself: no empty softmax
    frames = causal.clone()
    for row, spans in enumerate(frame_spans):
        for start, end in spans:
            frames[row, start:end, start:end] = True

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(B, 1, L, L, dtype=dtype, device=valid.device)
        return mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)

    return additive(causal), additive(frames)


def mllm_forward(
    mllm: AnimeGamerMLLM, batch: dict[str, Any], states: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The batched, differentiable form of inference's two passes: representations `(B, 226, D)` and the logits
    `(B, 4, V)` of the four Strength slots (``READ_AT``; None when ``states`` is off)."""
    ids, valid = batch["ids"], batch["valid"]  # (B, L)
    N = mllm.num_query_tokens
    embeds = mllm.llm.get_input_embeddings()(ids)  # (B, L, H)
    if batch["history_slots"]:
        rows = mllm.input_resampler(batch["history"].to(embeds.dtype))  # (M, N, H)
        for (row, start), rep in zip(batch["history_slots"], rows, strict=True):
            embeds[row, start : start + N] = rep
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)  # (B, L): as if each row were alone
    causal, frames = attention_masks(valid, batch["frame_spans"], embeds.dtype)

    # 1. Representation pass over the prompt (it ends SUFFIX ids before the sequence does): the last N states
    hidden = mllm.llm.model(inputs_embeds=embeds, attention_mask=frames, position_ids=positions).last_hidden_state
    representation = mllm.output_resampler(hidden[:, -SUFFIX - N : -SUFFIX])  # (B, N, D)
    if not states:
        return representation, None

    # 2. State pass, causal, teacher-forced: logits where each Strength is chosen
    hidden = mllm.llm.model(inputs_embeds=embeds, attention_mask=causal, position_ids=positions).last_hidden_state
    logits = mllm.llm.lm_head(hidden[:, list(READ_AT)])  # (B, 4, V)
    return representation, logits


class PhaseBModel(nn.Module):
    """The MLLM; ``forward(batch, generator)`` is representation MSE plus the Strength tokens' cross-entropy."""

    def __init__(self, config: ToyModelConfig, tokenizer: AnimeGamerTokenizer, regression_weight: float = 1.0) -> None:
        super().__init__()
        self.regression_weight = regression_weight
        p = config.pipeline
        self.mllm = AnimeGamerMLLM(p.mllm, tokenizer.vocab_size, p.decoder.hidden_size, p.num_query_tokens)

    def forward(self, batch: dict[str, Any], generator: torch.Generator) -> torch.Tensor:
        representation, logits = mllm_forward(self.mllm, batch)
        assert logits is not None
        error = (representation.float() - batch["target_representation"].float()).pow(2)  # (B, 226, D)
        weights = batch.get("slot_weights")
        regression = error.mean() if weights is None else (error * weights[..., None]).mean()
        language = F.cross_entropy(logits.flatten(0, 1).float(), batch["target_states"].flatten())
        return self.regression_weight * regression + language


def read_phase_a(phase_a: Path, config: ToyModelConfig) -> dict[str, Any]:
    """Phase (a)'s record, refused by name when its files are missing or of other sizes."""
    from training.phase_a import OUTPUTS as A_OUTPUTS

    meta = read_phase(phase_a, "phase-a", A_OUTPUTS)
    check_sizes(meta, config.sizes(), phase_a / "phase_a.json")
    return meta


@dataclass
class PhaseA:
    """Phase (a)'s frozen outputs: the clip encoder, the VAE whose latents it reads, their scale, the record."""

    encoder: ClipEncoder
    vae: nn.Module
    scaling_factor: float
    meta: dict[str, Any]

    def clips(self, episodes: tuple[Episode, ...]) -> ClipSet:
        """The clips of ``episodes`` with their latents, as phase (a) made them (no frames)."""
        return ClipSet.encoded(episodes, self.vae, self.scaling_factor)


def load_phase_a(phase_a: Path, config: ToyModelConfig) -> PhaseA:
    meta = read_phase_a(phase_a, config)
    encoder = ClipEncoder(config)
    encoder.load_state_dict(torch.load(phase_a / "encoder.pt", weights_only=True))
    vae = build_initial_vae(config)
    vae.load_state_dict(torch.load(phase_a / "vae.pt", weights_only=True))
    return PhaseA(encoder.eval().requires_grad_(False), vae, float(meta["scaling_factor"]), meta)


@dataclass
class PhaseData:
    """One split's turns and everything their batches are built from."""

    samples: list[TurnSample]
    collate: PromptCollate


def prompt_data(
    episodes: tuple[Episode, ...], representations: torch.Tensor, config: ToyModelConfig, tokenizer: AnimeGamerTokenizer
) -> PhaseData:
    """The turns of ``episodes`` as prompts, with ``representations`` `(N, 226, D)` as their targets."""
    instructions = [clip.instruction for episode in episodes for clip in episode.clips]
    collate = PromptCollate(
        tokenizer, instructions, deltas_of(episodes), representations, config.pipeline.num_query_tokens
    )
    return PhaseData(turn_samples(episodes, config.history_window), collate)


def slot_weights(clips: ClipSet, config: ToyModelConfig, figure_weight: float) -> torch.Tensor:
    """Each clip's regression weight per slot `(N, 226)`: 1, and on a latent slot 1 + ``figure_weight`` x the share of
    its patch that is the character.

    Without it the MLLM learns the scenery and not the figure (measured on held-out turns: its error on the
    figure's slots was the error of predicting the training mean, while a lookup by character, action and adverb
    halves it): the figure covers a fifth of the latent slots, and a random layout's scenery the rest.
    """
    if len(clips) == 0:  # no held-out episode in a tiny data set
        return torch.ones(0, config.pipeline.num_query_tokens)
    p = config.pipeline.decoder.patch_size
    share = F.avg_pool2d(clips.cells.flatten(0, 1), p)  # (N * F, 1, h/p, w/p): the decoder's patch grid
    latent = 1.0 + figure_weight * share.view(len(clips), -1)  # (N, 120)
    text = torch.ones(len(clips), config.pipeline.decoder.num_text_tokens)
    summary = torch.ones(len(clips), config.pipeline.num_query_tokens - text.shape[1] - latent.shape[1])
    return torch.cat([text, latent, summary], dim=1)  # slot order of training.encoder.ClipEncoder


def phase_data(
    episodes: tuple[Episode, ...],
    phase_a: PhaseA,
    config: ToyModelConfig,
    tokenizer: AnimeGamerTokenizer,
    figure_weight: float = 0.0,
) -> PhaseData:
    """The prompts, their targets the encoder's representations of the true clips (read here, then dropped)."""
    clips = phase_a.clips(episodes)
    representations = encode_representations(phase_a.encoder, clips, config.max_instruction_bytes)
    data = prompt_data(episodes, representations, config, tokenizer)
    if figure_weight:
        data.collate.slot_weights = slot_weights(clips, config, figure_weight)
    return data


@torch.no_grad()
def own_predictions(mllm: AnimeGamerMLLM, data: PhaseData, batch: int = 8) -> torch.Tensor:
    """Every turn's representation as inference predicts it, in ClipSet order: `(N, 226, D)`.

    Turn k's past turns carry the predictions already made for turns before k, so the first turns of all episodes
    go first, then the second turns, and so on; past states stay the true ones (the model gets most of them right).
    The targets are not read: ``data`` may carry none.
    """
    was_training = mllm.training
    mllm.eval()
    predicted = torch.zeros(len(data.collate.instructions), mllm.num_query_tokens, mllm.representation_dim)
    # filled in below, turn by turn; standing in for the targets too, which the representation pass never reads
    own = replace(data.collate, representations=predicted, history_representations=predicted)
    for turn in range(1 + max((s.turn for s in data.samples), default=-1)):
        samples = [s for s in data.samples if s.turn == turn]
        for start in range(0, len(samples), batch):
            chunk = samples[start : start + batch]
            predicted[[s.clip for s in chunk]] = mllm_forward(mllm, own(chunk), states=False)[0].float()
    mllm.train(was_training)
    return predicted


def with_own_history(data: PhaseData, mllm: AnimeGamerMLLM) -> PhaseData:
    """The same turns, their past turns carrying the model's own predictions."""
    return PhaseData(data.samples, replace(data.collate, history_representations=own_predictions(mllm, data)))


class _Collate:
    """Routes each split's samples to its own collate (the loop takes one for both)."""

    def __init__(self, train: PromptCollate, held_out: PromptCollate) -> None:
        self.train, self.held_out = train, held_out

    def __call__(self, items: list[tuple[str, TurnSample]]) -> dict[str, Any]:
        split_name = items[0][0]
        collate = self.train if split_name == "train" else self.held_out
        return collate([sample for _, sample in items])


class _Tagged(Dataset):
    def __init__(self, name: str, samples: list[TurnSample]) -> None:
        self.name, self.samples = name, samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[str, TurnSample]:
        return self.name, self.samples[i]


def _stage(
    model: PhaseBModel,
    train_data: PhaseData,
    eval_data: PhaseData,
    config: TrainConfig,
    out: Path,
    sizes: dict[str, object],
    on_step: OnStep | None,
    description: str,
) -> tuple[TrainResult, PhaseBModel, Accelerator]:
    """One stage of phase (b) on the shared loop; each split keeps its own collate."""
    held_out = _Tagged("held_out", eval_data.samples) if eval_data.samples else None
    collate = _Collate(train_data.collate, eval_data.collate)
    trained, model, accelerator = train(
        model, _Tagged("train", train_data.samples), held_out, collate, config, out, sizes, on_step, description
    )
    return trained, model, accelerator  # type: ignore[return-value]


def without_history(data: PhaseData) -> PhaseData:
    """``data``'s turns with no past turn in their prompts: the same targets and weights, nothing encoded again."""
    return PhaseData([replace(sample, history=()) for sample in data.samples], data.collate)


def _numbered_from(on_step: OnStep | None, first: int) -> OnStep | None:
    """``on_step`` seeing a stage's steps numbered as the whole phase's, from ``first`` + 1."""
    if on_step is None:
        return None
    return lambda step, loss: on_step(first + step, loss)


def train_phase_b(
    data: Path,
    out: Path,
    phase_a: Path,
    config: TrainConfig | None = None,
    model_config: ToyModelConfig | None = None,
    on_step: OnStep | None = None,
) -> TrainResult:
    """Train the MLLM on the toy world ``data`` against phase (a)'s encoder in ``phase_a``; saves ``out/mllm.pt``."""
    config = config or TrainConfig()
    model_config = model_config or ToyModelConfig()
    out = Path(out)

    # 1. Phase (a)'s encoder (refused when missing or of other sizes), the data and its representations
    frozen = load_phase_a(Path(phase_a), model_config)
    world = load_toyworld(Path(data))
    training, held_out = split(world, config.held_out_every)
    if not training:
        raise DatasetError(f"{data} has no training episodes after holding out every {config.held_out_every}th.")
    tokenizer = model_config.tokenizer()
    train_data = phase_data(training, frozen, model_config, tokenizer, config.figure_weight)
    eval_data = phase_data(held_out, frozen, model_config, tokenizer, config.figure_weight)
    logger.info("phase b: %d training turns, %d held out", len(train_data.samples), len(eval_data.samples))
    sizes = model_config.sizes() | model_config.mllm_sizes() | {"phase_a.step": frozen.meta["step"]}

    # 2. The MLLM from the seed, then its stages in order, each resuming on its own (see ``stages``)
    torch.manual_seed(config.seed)
    model = PhaseBModel(model_config, tokenizer, config.regression_weight)
    alone = None
    if config.no_history_steps:  # the same turns and targets, their prompts without past turns
        alone = without_history(train_data), without_history(eval_data)
    result, first = TrainResult(step=0), 0
    for index, stage in enumerate(stages(config)):
        if stage.pasts == "none" and alone is not None:
            train_stage, eval_stage = alone
        elif stage.pasts == "own":  # from the model the stages before left, turn after turn as the game feeds them
            train_stage, eval_stage = with_own_history(train_data, model.mllm), with_own_history(eval_data, model.mllm)
        else:
            train_stage, eval_stage = train_data, eval_data
        stage_config = replace(config, steps=stage.steps, seed=config.seed + index)
        shifted = _numbered_from(on_step, first)
        stage_sizes = sizes | ({"first_step": first} if first else {})
        stage_out = out / stage.folder if stage.folder else out
        done, model, accelerator = _stage(
            model, train_stage, eval_stage, stage_config, stage_out, stage_sizes, shifted, stage.description
        )
        result = TrainResult(  # every stage's steps, numbered as one run
            step=first + done.step,
            losses=result.losses | {first + k: v for k, v in done.losses.items()},
            eval_losses=result.eval_losses | {first + k: v for k, v in done.eval_losses.items()},
        )
        first += stage.steps
    if accelerator.is_main_process:
        torch.save(model.mllm.state_dict(), out / "mllm.pt")
        meta = {"phase": "b", "step": result.step, "sizes": sizes}
        (out / "phase_b.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    accelerator.wait_for_everyone()
    return result
