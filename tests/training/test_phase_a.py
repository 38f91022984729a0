"""Phase (a) smoke test: the losses fall, the trained VAE reconstructs, a resumed run equals an uninterrupted one,
bad input is refused by name."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests import tiers
from training.config import ToyModelConfig, TrainConfig
from training.dataset import DatasetError, load_toyworld, split, write_toyworld
from training.encoder import ClipEncoder, instruction_bytes
from training.loop import PROGRESS, STATE, CheckpointMismatchError, StepBatchSampler, mean
from training.phase_a import (
    OUTPUTS,
    VAE_STAGE,
    ClipSet,
    PhaseAResult,
    VAEModel,
    build_initial_vae,
    figure_cells,
    frames_to_tensor,
    train_phase_a,
)
from worker.pipeline.vae import build_vae

STEPS = 30
VAE_STEPS = 10
CONFIG = TrainConfig(
    steps=STEPS,
    batch_size=2,
    learning_rate=2e-3,
    eval_every=10,
    checkpoint_every=10,
    held_out_every=2,
    seed=0,
    vae_steps=VAE_STEPS,
    vae_learning_rate=2e-3,
    lr_decay=0.5,  # the rate falls across the resume point of the resume test
    vae_figure_weight=5.0,
    figure_weight=3.0,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("phase-a") / "toyworld"
    write_toyworld(folder, clips=8, seed=0)
    return folder


@pytest.fixture(scope="module")
@tiers.slow_fixture  # trains phase (a) for about 11 s: its tests run in the slow tier
def uninterrupted(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PhaseAResult]:
    out = tmp_path_factory.mktemp("phase-a") / "ckpt"
    return out, train_phase_a(data, out, CONFIG)


def test_encoder_reads_latents_into_226_slots() -> None:
    config = ToyModelConfig()
    encoder = ClipEncoder(config)
    p = config.pipeline
    latents = torch.randn(2, p.latent_frames, p.decoder.latent_channels, p.latent_height, p.latent_width)
    ids = instruction_bytes(["Kiki flies", ""], config.max_instruction_bytes)
    assert encoder(latents, ids).shape == (2, 226, p.decoder.hidden_size)


def test_each_latent_slot_reads_its_own_patch() -> None:
    """Slot j holds the decoder's video token j: changing one 2 x 2 patch of one latent frame changes that slot only,
    among the latent slots (the summary slots read them all)."""
    config = ToyModelConfig()
    encoder = ClipEncoder(config).eval()
    p = config.pipeline
    latents = torch.randn(1, p.latent_frames, p.decoder.latent_channels, p.latent_height, p.latent_width)
    ids = instruction_bytes(["Kiki flies"], config.max_instruction_bytes)
    changed = latents.clone()
    changed[0, 2, :, 4:6, 6:8] += 1.0  # frame 2, patch row 2, patch column 3
    _, h, w = p.latent_frames, p.latent_height // 2, p.latent_width // 2
    text = p.decoder.num_text_tokens
    with torch.no_grad():
        moved = (encoder(changed, ids) - encoder(latents, ids)).abs().amax(dim=-1)[0]  # (226,)
    latent_slots = moved[text : text + encoder.num_latent_slots]
    assert latent_slots.nonzero().flatten().tolist() == [2 * h * w + 2 * w + 3]


def test_data_order_depends_only_on_seed_and_step() -> None:
    whole = list(StepBatchSampler(5, 2, seed=3, start=0, stop=9))
    assert list(StepBatchSampler(5, 2, seed=3, start=4, stop=9)) == whole[4:]
    # the first 5 steps are two epochs of 5 samples: every clip twice
    assert sorted(i for batch in whole[:5] for i in batch) == sorted([*range(5), *range(5)])


def test_vae_loss_falls_and_the_trained_vae_reconstructs(data: Path, uninterrupted: tuple[Path, PhaseAResult]) -> None:
    out, result = uninterrupted
    values = [result.vae_losses[step] for step in sorted(result.vae_losses)]
    assert len(values) == VAE_STEPS == result.vae_step
    assert mean(values[-5:]) < mean(values[:5])

    config = ToyModelConfig()
    trained = build_vae(config.pipeline.vae).eval()
    trained.load_state_dict(torch.load(out / "vae.pt"))
    training, _ = split(load_toyworld(data), CONFIG.held_out_every)
    clip = frames_to_tensor(training[0].frames()[:1]).permute(0, 2, 1, 3, 4)  # (1, 3, T, H, W) in [-1, 1]

    def round_trip_mse(vae: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(((vae.decode(vae.encode(clip).latent_dist.mean).sample - clip) ** 2).mean())

    assert round_trip_mse(trained) < round_trip_mse(build_initial_vae(config))


def test_loss_falls_and_outputs_are_saved(uninterrupted: tuple[Path, PhaseAResult]) -> None:
    out, result = uninterrupted
    losses = result.losses
    values = [losses[step] for step in sorted(losses)]
    assert len(values) == STEPS
    assert mean(values[-5:]) < mean(values[:5])
    for name in OUTPUTS:
        assert (out / name).is_file()
    assert json.loads((out / STATE / PROGRESS).read_text())["step"] == STEPS


def test_interrupted_and_resumed_equals_uninterrupted(
    data: Path, tmp_path: Path, uninterrupted: tuple[Path, PhaseAResult]
) -> None:
    out, result = uninterrupted
    expected = result.losses
    # The VAE stage finishes before the encoder + decoder stage's first checkpoint; start from its finished state
    # (to save its training time here) so the stop and resume fall inside the second stage.
    shutil.copytree(out / VAE_STAGE, tmp_path / VAE_STAGE)

    def crash(step: int, loss: float) -> None:
        if step == 20:  # just after the step-20 checkpoint
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_phase_a(data, tmp_path, CONFIG, on_step=crash)
    assert json.loads((tmp_path / STATE / PROGRESS).read_text())["step"] == 20
    resumed = train_phase_a(data, tmp_path, CONFIG)
    assert resumed.vae_losses == {} and resumed.vae_step == VAE_STEPS  # loaded, not trained again
    assert sorted(resumed.losses) == list(range(21, STEPS + 1))
    assert resumed.losses[STEPS] == pytest.approx(expected[STEPS], abs=1e-5)


def test_checkpoint_from_another_config_is_refused(data: Path, tmp_path: Path) -> None:
    train_phase_a(data, tmp_path, replace(CONFIG, steps=1, vae_steps=1))
    base = ToyModelConfig()
    other = replace(base, pipeline=replace(base.pipeline, decoder=replace(base.pipeline.decoder, num_layers=1)))
    with pytest.raises(CheckpointMismatchError, match=r"decoder\.num_layers: checkpoint 2, current 1"):
        train_phase_a(data, tmp_path, replace(CONFIG, steps=2, vae_steps=1), other)
    # more VAE steps change the latents the saved encoder + decoder learned on: refused by name too
    with pytest.raises(CheckpointMismatchError, match=r"vae\.trained_steps: checkpoint 1, current 2"):
        train_phase_a(data, tmp_path, replace(CONFIG, steps=2, vae_steps=2))


def test_empty_data_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="is empty"):
        train_phase_a(tmp_path / "empty", tmp_path / "out", CONFIG)


def test_half_written_data_folder_is_refused(data: Path, tmp_path: Path) -> None:
    half = tmp_path / "half"
    half.mkdir()
    (half / "episode_00000.npz").write_bytes((data / "episode_00000.npz").read_bytes())
    with pytest.raises(DatasetError, match="half-written"):
        train_phase_a(half, tmp_path / "out", CONFIG)


def test_cli_trains_and_refuses_an_empty_folder(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from animegamer.cli import main

    args = ["train", "phase-a", "--data", str(data), "--out", str(tmp_path / "ck"), "--steps", "2", "--vae-steps", "1"]
    args += ["--model", "tiny", "--batch-size", "2"]
    assert main(args) == 0
    assert "Phase a at step 2" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["train", "phase-a", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 1
    assert "is empty" in capsys.readouterr().err


def test_figure_cells_are_the_characters_share_of_each_latent_cell() -> None:
    """Latent frame 0 comes from frame 0 alone, latent frame 1 from frames 1-4; a cell is 8 x 8 pixels."""
    figure = torch.zeros(1, 9, 1, 16, 24, dtype=torch.bool)  # (N, T, 1, H, W): 3 latent frames of 2 x 3 cells
    figure[0, 1:5, 0, 8:16, 16:24] = True  # all of cell (1, 2) in latent frame 1
    figure[0, 0, 0, 0:8, 0:4] = True  # half of cell (0, 0) in latent frame 0
    cells = figure_cells(figure, frames=3, grid=(2, 3))
    assert cells.shape == (1, 3, 1, 2, 3)
    assert cells[0, 1, 0, 1, 2] == 1.0 and cells[0, 0, 0, 0, 0] == 0.5
    assert cells.sum() == 1.5


def test_clips_encoded_in_chunks_equal_the_whole_set_encoded_and_keep_no_frames(data: Path) -> None:
    episodes = load_toyworld(data).episodes
    vae = build_initial_vae(ToyModelConfig())
    whole = ClipSet(episodes)
    whole.encode(vae, 0.7)
    chunked = ClipSet.encoded(episodes, vae, 0.7, chunk=1)
    assert len(episodes) > 1  # more than one chunk
    torch.testing.assert_close(chunked.latents, whole.latents, atol=1e-3, rtol=1e-3)  # other batches, other sums
    torch.testing.assert_close(chunked.cells, whole.cells)
    assert (chunked.instructions, chunked.flows) == (whole.instructions, whole.flows)
    assert len(chunked) == len(whole) and chunked.frames.numel() == 0


def test_the_vae_loss_weighs_the_characters_pixels() -> None:
    """An error on the character's pixels costs 1 + figure_weight times what the same error costs on scenery."""

    class Identity(torch.nn.Module):  # a VAE whose latent is its input and whose output is off by ``wrong``
        def __init__(self, wrong: torch.Tensor) -> None:
            super().__init__()
            self.wrong = wrong

        def encode(self, x: torch.Tensor) -> SimpleNamespace:
            dist = SimpleNamespace(mean=x * 0, var=x * 0 + 1, logvar=x * 0, sample=lambda generator: x)
            return SimpleNamespace(latent_dist=dist)

        def decode(self, z: torch.Tensor) -> SimpleNamespace:
            return SimpleNamespace(sample=z + self.wrong)

    x = torch.zeros(1, 9, 3, 8, 8)
    figure = torch.zeros(1, 9, 1, 8, 8, dtype=torch.bool)
    figure[..., :4, :] = True
    on_figure, on_scenery = torch.zeros(1, 3, 9, 8, 8), torch.zeros(1, 3, 9, 8, 8)
    on_figure[..., :4, :], on_scenery[..., 4:, :] = 0.5, 0.5

    def loss(wrong: torch.Tensor) -> float:
        model = VAEModel(Identity(wrong), kl_weight=0.0, frames=9, figure_weight=4.0)
        return float(model({"frames": x, "figure": figure}, torch.Generator()))

    assert loss(on_figure) == pytest.approx(5 * loss(on_scenery))


def test_the_rate_is_constant_then_falls_to_a_tenth() -> None:
    config = TrainConfig(steps=10, learning_rate=1.0, lr_decay=0.5)
    rates = [config.learning_rate_at(step) for step in range(1, 11)]
    assert rates[:5] == [1.0] * 5
    assert rates[5:] == pytest.approx([0.82, 0.64, 0.46, 0.28, 0.1])
    assert TrainConfig(steps=10, learning_rate=1.0).learning_rate_at(10) == 1.0
