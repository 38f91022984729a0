"""A tiny toy world and a finished tiny phase (a), shared by the later phases' tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.config import ToyModelConfig, TrainConfig
from training.dataset import write_toyworld
from training.phase_a import train_phase_a

# A few steps of every stage: enough to write real outputs, far too few to learn anything.
PHASE_A_QUICK = TrainConfig(steps=4, batch_size=2, eval_every=0, checkpoint_every=0, held_out_every=2, vae_steps=2)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("world") / "toyworld"
    write_toyworld(folder, clips=12, seed=3)
    return folder


@pytest.fixture(scope="session")
def tiny_phase_a(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "phase_a"
    train_phase_a(tiny_world, out, PHASE_A_QUICK, ToyModelConfig())
    return out


@pytest.fixture(scope="session")
def tiny_phase_b(tiny_world: Path, tiny_phase_a: Path) -> Path:
    from training.phase_b import train_phase_b

    out = tiny_phase_a.parent / "phase_b"
    train_phase_b(tiny_world, out, tiny_phase_a, PHASE_B_QUICK, ToyModelConfig())
    return out


PHASE_B_QUICK = TrainConfig(steps=3, batch_size=2, eval_every=0, checkpoint_every=0, held_out_every=2)
