"""Training sizes and schedule, as plain dataclasses.

``ToyModelConfig`` is what a checkpoint must agree with: its ``sizes()`` are written next to every saved state and
compared on resume, so a checkpoint from another config is refused by name instead of failing deep in
``load_state_dict``. ``TrainConfig`` is the schedule; it may change between runs (more steps, another eval interval).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from worker.pipeline.config import PipelineConfig, tiny
from worker.pipeline.tokenizer import AnimeGamerTokenizer, WordBase
from worker.pipeline.toy import toy_tokenizer


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200  # optimiser steps in all, counted across resumes
    batch_size: int = 2  # clips per step and process
    learning_rate: float = 1e-3  # AdamW; constant but for the last lr_decay share of the steps
    lr_decay: float = 0.0  # the share of the steps, at the end, over which the rate falls linearly to a tenth
    weight_decay: float = 0.0
    eval_every: int = 50  # steps between held-out evaluations (0: never)
    checkpoint_every: int = 50  # steps between saved states (0: only at the end)
    held_out_every: int = 10  # every N-th episode is held out (training.dataset.split)
    seed: int = 0  # model init, data order and diffusion noise all derive from it
    figure_weight: float = 0.0  # latent cells (phases a, c) or slots (b) weigh 1 + this x the character's share
    # Phase (a)'s first stage: the VAE trained as an autoencoder on the training clips (see training.phase_a)
    vae_steps: int = 300  # VAE optimiser steps in all, counted across resumes (0: keep the random init)
    vae_learning_rate: float = 1e-3  # AdamW, constant
    vae_batch_size: int = 4  # clips per VAE step and process: its convolutions run at full resolution
    vae_kl_weight: float = 1e-4  # weight of the posterior's mean per-element KL against the pixel MSE
    vae_frames: int = 9  # frames per training crop, 1 + a multiple of 8, the VAE's frame batch (0: whole clip)
    vae_figure_weight: float = 0.0  # the character's pixels weigh 1 + this in the VAE's loss (toyworld.character_mask)
    # Phase (b): the shares of its ``steps``, at the start, whose prompts hold no past turn, and at the end, whose past
    # turns carry the model's own predictions (scheduled sampling); the steps between have the true pasts
    no_history: float = 0.0
    own_history: float = 0.0
    regression_weight: float = 1.0  # phase (b): the representation's MSE against the states' cross-entropy
    mixed_precision: str = "no"  # accelerate's: "bf16" runs the forward under autocast, trained weights kept fp32

    def learning_rate_at(self, step: int) -> float:
        """The rate of optimiser step ``step`` (1-based): a pure function of the step, so a resumed run keeps it."""
        decay_steps = round(self.steps * self.lr_decay)
        into = step - (self.steps - decay_steps)
        if decay_steps == 0 or into <= 0:
            return self.learning_rate
        return self.learning_rate * (1.0 - 0.9 * min(1.0, into / decay_steps))

    @property
    def no_history_steps(self) -> int:
        """How many of the first steps ``no_history`` is."""
        return min(round(self.steps * self.no_history), self.steps)

    @property
    def own_history_steps(self) -> int:
        """How many of the last steps ``own_history`` is; some step before them has the true past."""
        return max(0, min(round(self.steps * self.own_history), self.steps - 1 - self.no_history_steps))

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be positive, got {self.steps} and {self.batch_size}")
        if min(self.vae_steps, self.vae_frames, self.vae_kl_weight, self.vae_figure_weight, self.figure_weight) < 0:
            raise ValueError("vae_steps, vae_frames, vae_kl_weight and the figure weights must be >= 0")
        if self.vae_batch_size < 1:
            raise ValueError(f"vae_batch_size must be >= 1, got {self.vae_batch_size}")
        if self.vae_frames and (self.vae_frames - 1) % 8:
            raise ValueError(f"vae_frames must be 0 or 1 + a multiple of 8, got {self.vae_frames}")
        if not 0.0 <= self.lr_decay <= 1.0:
            raise ValueError(f"lr_decay is a share of the steps, 0 to 1, got {self.lr_decay}")
        if not 0.0 <= self.own_history <= 1.0 or not 0.0 <= self.no_history <= 1.0:
            raise ValueError(
                f"own_history and no_history are shares of the steps, 0 to 1, got {self.own_history}, {self.no_history}"
            )
        if self.eval_every < 0 or self.checkpoint_every < 0:
            raise ValueError("eval_every and checkpoint_every must be >= 0 (0 turns them off)")


@dataclass(frozen=True)
class ToyModelConfig:
    """The trained sizes: the tiny pipeline's decoder and VAE plus the phase-(a) clip encoder.

    The VAE is the tiny CogVideoX VAE initialised from ``vae_seed``; phase (a) first trains it as an autoencoder on
    the training clips (``TrainConfig.vae_steps``), then freezes it (its encoder's posterior mean is the latent)
    and saves it beside the decoder, so inference decodes with the very VAE the decoder learned on.
    """

    pipeline: PipelineConfig = field(default_factory=tiny)  # decoder, VAE and clip sizes (17 x 64 x 96)
    encoder_hidden: int = 256  # width of the clip encoder's MLP over each latent patch
    max_instruction_bytes: int = 128  # longer instructions are cut, with a warning
    vae_seed: int = 0  # the VAE's init seed, before its training
    history_window: int = 3  # phase (b)'s prompts: the current turn and up to 2 past ones (game.history)
    words: tuple[str, ...] = ()  # the MLLM's word list (tokenizer.WordBase); empty: bytes only, as the tiny model

    def __post_init__(self) -> None:
        expected = WordBase(self.words).vocab_size
        if self.pipeline.mllm.base_vocab_size != expected:
            raise ValueError(
                f"the MLLM's base vocabulary is {self.pipeline.mllm.base_vocab_size} ids, but bytes and "
                f"{len(self.words)} words are {expected}: build the config with reading_words()"
            )

    def reading_words(self, words: tuple[str, ...]) -> ToyModelConfig:
        """This config with the MLLM reading ``words`` (its base vocabulary grown to match)."""
        mllm = replace(self.pipeline.mllm, base_vocab_size=WordBase(words).vocab_size)
        return replace(self, pipeline=replace(self.pipeline, mllm=mllm), words=words)

    def tokenizer(self) -> AnimeGamerTokenizer:
        """The tokenizer the shipped file will name (``worker.pipeline.toy.toy_tokenizer``), so training reads the
        prompts as inference will."""
        return toy_tokenizer(self.words)

    def sizes(self) -> dict[str, object]:
        """Every size a checkpoint depends on, flat and JSON-normalised (tuples become lists)."""
        p = self.pipeline
        flat: dict[str, object] = {f"decoder.{k}": v for k, v in asdict(p.decoder).items()}
        flat |= {f"vae.{k}": v for k, v in asdict(p.vae).items()}
        flat |= {"clip.frames": p.num_frames, "clip.height": p.height, "clip.width": p.width}
        flat |= {
            "encoder.hidden": self.encoder_hidden,
            "encoder.max_instruction_bytes": self.max_instruction_bytes,
            "vae_seed": self.vae_seed,
        }
        return json.loads(json.dumps(flat))

    def mllm_sizes(self) -> dict[str, object]:
        """What phase (b)'s states depend on beyond ``sizes()``: the MLLM and its prompts' history window."""
        flat: dict[str, object] = {f"mllm.{k}": v for k, v in asdict(self.pipeline.mllm).items()}
        flat["mllm.history_window"] = self.history_window
        flat["mllm.words"] = list(self.words)
        return json.loads(json.dumps(flat))


# The schedules `animegamer train all` runs (measured on 2 CPU cores: README, "Training"); one phase's flags on
# the command line override its own entry only.
RECIPE: dict[str, TrainConfig] = {
    "phase-a": TrainConfig(
        steps=1000,
        batch_size=16,
        eval_every=250,
        checkpoint_every=250,
        lr_decay=0.3,
        figure_weight=3.0,
        vae_steps=1200,  # the figure is kept in 56% of unseen clips after 300 steps, 95% after 1000 (README)
        vae_learning_rate=2e-3,
        vae_batch_size=4,
        vae_figure_weight=12.0,  # 95% kept at 1000 steps, against 81% with 5.0 (README, "Training")
    ),
    # every step reads the current turn alone, as the game plays by default (Settings.history_window 1); the model
    # trained before this, half its steps on past turns and its decoder through phase (c), moved the figure the
    # right way in 19 of 37 unseen turns, this recipe's in 29 (README, "The toy model"). The representation's MSE
    # weighs 10x against the states' cross-entropy and the slots of the character's latent patches 1 + 4x its
    # share, or the model settles on the mean scene with no one in it
    "phase-b": TrainConfig(
        steps=1600,
        batch_size=8,
        learning_rate=1e-3,
        eval_every=400,
        checkpoint_every=200,
        no_history=1.0,
        lr_decay=0.3,
        regression_weight=10.0,
        figure_weight=4.0,
    ),
}


# Phase (c) as `animegamer train phase-c` runs it. `train all` leaves it out: measured on 20 unseen episodes (68
# turns) played as the game plays them, it lowered what phase (a)'s decoder draws from the MLLM's predictions
# (figure found in 56 turns against 62, moved the right way in 23 of 37 against 29; README, "The toy model").
PHASE_C = TrainConfig(
    steps=500,
    batch_size=16,
    learning_rate=5e-4,
    eval_every=200,
    checkpoint_every=200,
    lr_decay=0.3,
    figure_weight=3.0,
)
