"""The training loop every phase shares, written on `accelerate` so one code path runs on a CPU and on many GPUs.

Resuming gives the same result as not stopping: model, optimiser and RNG states come back from
``accelerator.save_state``, the data order is a pure function of ``(seed, step)`` (a permutation per epoch, already
done batches skipped by position, not by replaying a loader), and each step's noise comes from a generator seeded
with ``(seed, step, process)``, as does the global generator's (dropout): restoring accelerate's saved RNG states
alone left a resumed run's LoRA dropout masks different from an unstopped run's. A phase supplies a module whose
``forward(batch, generator)`` returns the loss.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, set_seed
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm.auto import tqdm

from training.config import TrainConfig

logger = logging.getLogger(__name__)

STATE = "state"
PROGRESS = "progress.json"
LOSSES = "losses.jsonl"  # one line a step: {"step": n, "loss": x} (and "held_out" at evaluations)
EVAL_TAG = 2**31 - 1  # the "step" the evaluation noise is drawn for: the same noise at every evaluation

Collate = Callable[[list[Any]], dict[str, Any]]
OnStep = Callable[[int, float], None]


class CheckpointMismatchError(ValueError):
    """A saved state was written with other model sizes than the current config's."""


def step_seed(seed: int, step: int, process: int = 0) -> int:
    """A 63-bit seed for one (seed, step, process); SeedSequence keeps neighbouring steps unrelated."""
    return int(np.random.SeedSequence([seed, step, process]).generate_state(2, np.uint64)[0] >> np.uint64(1))


class StepBatchSampler(Sampler[list[int]]):
    """Batches for steps ``start .. stop - 1``: sample k of the run is ``permutation(seed, epoch)[k % n]``.

    Each epoch is a fresh permutation drawn from ``(seed, epoch)``, so the batch of any step is known without
    replaying the ones before it: a resumed run starts at its step and sees what an uninterrupted one would.
    """

    def __init__(self, size: int, batch_size: int, seed: int, start: int, stop: int) -> None:
        if size < 1:
            raise ValueError("the training set is empty")
        self.size, self.batch_size, self.seed, self.start, self.stop = size, batch_size, seed, start, stop

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def __iter__(self) -> Iterator[list[int]]:
        cache: dict[int, np.ndarray] = {}
        for step in range(self.start, self.stop):
            batch = []
            for k in range(step * self.batch_size, (step + 1) * self.batch_size):
                epoch = k // self.size
                if epoch not in cache:
                    cache = {epoch: self._permutation(epoch)}
                batch.append(int(cache[epoch][k % self.size]))
            yield batch

    def __len__(self) -> int:
        return max(0, self.stop - self.start)


@dataclass
class TrainResult:
    step: int  # the last finished step
    losses: dict[int, float] = field(default_factory=dict)  # step (1-based) -> training loss, this run only
    eval_losses: dict[int, float] = field(default_factory=dict)  # step -> mean held-out loss


def _check_sizes(saved: dict[str, object], current: dict[str, object], where: Path) -> None:
    differ = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
    if differ:
        detail = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, current {current.get(k)!r}" for k in differ)
        raise CheckpointMismatchError(
            f"{where} was written by a model of other sizes ({detail}). "
            "Train with the checkpoint's config, or choose a new --out folder."
        )


def read_progress(out: Path) -> dict[str, Any] | None:
    """The saved step and sizes under ``out``, or None when nothing was saved there yet."""
    path = Path(out) / STATE / PROGRESS
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _save(accelerator: Accelerator, out: Path, step: int, sizes: dict[str, object], config: TrainConfig) -> None:
    """Save into ``state.tmp`` and swap it in, so a crash mid-save leaves the previous state whole."""
    tmp, final, old = out / f"{STATE}.tmp", out / STATE, out / f"{STATE}.old"
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        # made before the barrier: accelerate makes it on the main process only, and the others write their RNG
        # states into it with no barrier between (a process once found no folder there)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        progress = {"step": step, "sizes": sizes, "train": asdict(config)}
        (tmp / PROGRESS).write_text(json.dumps(progress, indent=1, sort_keys=True) + "\n")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        if old.exists():
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: nn.Module, loader: DataLoader, seed: int) -> float:
    """Mean loss over the held-out loader, with the same noise at every evaluation so the numbers compare."""
    model.eval()
    generator = torch.Generator(accelerator.device).manual_seed(step_seed(seed, EVAL_TAG, accelerator.process_index))
    total, count = 0.0, 0
    for batch in loader:
        loss = model(batch, generator)
        losses = accelerator.gather_for_metrics(loss.detach().reshape(1))
        total += float(losses.sum())
        count += int(losses.numel())
    model.train()
    return total / max(count, 1)


def train(
    model: nn.Module,
    train_set: Dataset,
    eval_set: Dataset | None,
    collate: Collate,
    config: TrainConfig,
    out: Path,
    sizes: dict[str, object],
    on_step: OnStep | None = None,
    description: str = "train",
) -> tuple[TrainResult, nn.Module, Accelerator]:
    """Train ``model`` to ``config.steps``, resuming from ``out/state`` when it is there.

    ``sizes`` are compared with the saved ones before anything is loaded. ``on_step(step, loss)`` runs after each
    step (and after that step's checkpoint), so raising in it interrupts exactly like a crash would.
    Returns the result, the unwrapped model and the accelerator.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # accelerate keeps one AcceleratorState a process and refuses a second precision: a process that trains phases
    # one after another (`train all`, the tests) lets each choose its own. The distributed state is kept.
    AcceleratorState._reset_state()
    accelerator = Accelerator(
        mixed_precision=config.mixed_precision,
        # Each step's batch is drawn whole (batch_size x processes) and split among the processes: N processes take
        # the same steps over the same clips as one process with N times the batch, and resume at the same step.
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        # A phase need not use every trained part at every step (phase b's input resampler reads past turns only).
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
    )
    processes = accelerator.num_processes
    set_seed(config.seed)

    # 1. Resume point; refuse a state of other sizes before touching it
    start = 0
    progress = read_progress(out)
    if progress is not None:
        _check_sizes(progress["sizes"], sizes, out / STATE)
        start = int(progress["step"])

    # 2. Optimiser, data, prepare
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.learning_rate, weight_decay=config.weight_decay
    )
    sampler = StepBatchSampler(len(train_set), config.batch_size * processes, config.seed, start, config.steps)  # type: ignore[arg-type]
    loader = DataLoader(train_set, batch_sampler=sampler, collate_fn=collate)
    eval_loader = None
    if eval_set is not None and len(eval_set) > 0:  # type: ignore[arg-type]
        eval_loader = DataLoader(eval_set, batch_size=config.batch_size * processes, shuffle=False, collate_fn=collate)
    else:
        logger.warning("no held-out clips: evaluation is skipped")
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = accelerator.prepare_data_loader(loader, device_placement=True)
    if eval_loader is not None:
        eval_loader = accelerator.prepare_data_loader(eval_loader)
    if progress is not None:
        accelerator.load_state(str(out / STATE))
        logger.info("resumed %s from step %d", out / STATE, start)

    # 3. The loop; the loss log keeps the steps the resumed state holds, so a step killed after its save is not
    # listed twice
    log = _loss_log(out, start) if accelerator.is_main_process else None
    result = TrainResult(step=start)
    model.train()
    bar = tqdm(total=config.steps, initial=start, desc=description, disable=not accelerator.is_local_main_process)
    for step, batch in enumerate(loader, start + 1):
        seed = step_seed(config.seed, step, accelerator.process_index)
        generator = torch.Generator(accelerator.device).manual_seed(seed)
        torch.manual_seed(seed)  # and what draws from the global generator (peft's LoRA dropout) draws per step
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate_at(step)
        loss = model(batch, generator)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = float(accelerator.reduce(loss.detach(), reduction="mean"))
        result.losses[step] = value
        result.step = step
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}")
        if eval_loader is not None and config.eval_every and step % config.eval_every == 0:
            result.eval_losses[step] = evaluate(accelerator, model, eval_loader, config.seed)
            logger.info("step %d: held-out loss %.5f", step, result.eval_losses[step])
        if log is not None:
            line: dict[str, float] = {"step": step, "loss": value}
            if step in result.eval_losses:
                line["held_out"] = result.eval_losses[step]
            log.write(json.dumps(line) + "\n")
            log.flush()
        if (config.checkpoint_every and step % config.checkpoint_every == 0) or step == config.steps:
            _save(accelerator, out, step, sizes, config)
        if on_step is not None:
            on_step(step, value)
    bar.close()
    if log is not None:
        log.close()
    return result, accelerator.unwrap_model(model), accelerator


def _loss_log(out: Path, start: int) -> TextIO:
    """``out/losses.jsonl`` open for appending, holding only the lines of steps up to ``start``."""
    path = out / LOSSES
    kept = []
    if path.is_file():
        kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= start]
    path.write_text("".join(line + "\n" for line in kept))
    return path.open("a")


def read_losses(out: Path) -> dict[int, float]:
    """Step -> training loss, from a phase folder's ``losses.jsonl``."""
    path = Path(out) / LOSSES
    lines = path.read_text().splitlines() if path.is_file() else []
    return {entry["step"]: entry["loss"] for entry in map(json.loads, lines)}


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
