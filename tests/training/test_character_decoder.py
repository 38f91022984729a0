"""Phases (a) and (c) for the published architecture, at the tiny sizes: the decoder's LoRA learns by v-prediction.

The inputs are fixed random latents, conditions and features (the real ones come from your clips through the
frozen encoders and from phase (b)); what is tested is what trains, and that the loss falls through the shared
run loop.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from training.character_decoder import DecoderPhase, stack, trainable_decoder
from training.config import TrainConfig
from training.loop import train
from worker.pipeline.config import tiny
from worker.pipeline.decoder import AnimeGamerDecoder

CFG = tiny()


def decoder(phase: str) -> AnimeGamerDecoder:
    torch.manual_seed(0)
    return trainable_decoder(AnimeGamerDecoder.from_pipeline_config(CFG.decoder), phase)


def samples(phase: str, count: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    dec = CFG.decoder
    made = []
    for i in range(count):
        sample = {
            "latents": torch.randn(
                CFG.latent_frames, dec.latent_channels, CFG.latent_height, CFG.latent_width, generator=g
            ),
            "flow": torch.tensor(float(i * 10)),
        }
        if phase == "a":
            sample["text"] = torch.randn(dec.num_text_tokens, dec.text_embed_dim, generator=g)
            sample["image"] = torch.randn(dec.num_ip_tokens, dec.ip_embed_dim, generator=g)
        else:
            sample["condition"] = torch.randn(CFG.num_query_tokens, dec.hidden_size, generator=g)
        made.append(sample)
    return made


@torch.no_grad()
def mean_loss(model: DecoderPhase, data: list[dict[str, torch.Tensor]]) -> float:
    """The loss over the whole set at eight fixed noise draws, so two models compare on the same noise."""
    batch = stack(data)
    return sum(float(model(batch, torch.Generator().manual_seed(seed))) for seed in range(8)) / 8


@pytest.mark.parametrize("phase", ["a", "c"])
def test_the_lora_and_the_motion_embedding_train_and_in_phase_a_the_clip_projections(phase: str) -> None:
    trained = {name.split(".")[0] for name, p in decoder(phase).named_parameters() if p.requires_grad}
    lora_blocks = {"transformer_blocks"}  # only their LoRA matrices
    assert trained == lora_blocks | {"flow_embedding"} | (
        {"text_proj", "text_norm", "ip_proj", "ip_norm"} if phase == "a" else set()
    )
    lora = [name for name, p in decoder(phase).named_parameters() if p.requires_grad and name.startswith("transformer")]
    assert lora and all(".lora_" in name for name in lora)


@pytest.mark.parametrize("phase", ["a", "c"])
def test_the_v_prediction_loss_falls(phase: str, tmp_path: Path) -> None:
    data = samples(phase)
    model = DecoderPhase(decoder(phase))
    before = mean_loss(model, data)
    config = TrainConfig(steps=60, batch_size=4, learning_rate=3e-3, eval_every=0, checkpoint_every=0)
    result, trained, _ = train(model, data, None, stack, config, tmp_path / phase, {"phase": phase})
    assert result.step == 60
    after = mean_loss(trained, data)
    assert after < 0.9 * before, (before, after)


def test_gradient_checkpointing_gives_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    base = AnimeGamerDecoder.from_pipeline_config(CFG.decoder)
    kept, recomputed = (
        DecoderPhase(trainable_decoder(copy.deepcopy(base), "c", checkpointing=on)) for on in (False, True)
    )
    recomputed.load_state_dict(kept.state_dict())  # the same LoRA draw in both
    batch = stack(samples("c", 2))
    losses = []
    for model in (kept, recomputed):
        model.train()
        loss = model(batch, torch.Generator().manual_seed(3))
        loss.backward()
        losses.append(loss.detach())
    assert recomputed.decoder.gradient_checkpointing and not kept.decoder.gradient_checkpointing
    torch.testing.assert_close(losses[0], losses[1])
    for (name, a), (_, b) in zip(kept.named_parameters(), recomputed.named_parameters(), strict=True):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_a_phase_runs_in_bf16_autocast_with_its_trained_weights_kept_in_float32(tmp_path: Path) -> None:
    model = DecoderPhase(decoder("c"))
    seen: set[torch.dtype] = set()
    model.decoder.transformer_blocks[0].ff.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    config = TrainConfig(steps=2, batch_size=2, eval_every=0, checkpoint_every=0, mixed_precision="bf16")
    result, trained, _ = train(model, samples("c"), None, stack, config, tmp_path / "bf16", {"phase": "c"})
    assert seen == {torch.bfloat16}  # the blocks ran in bf16
    assert len(result.losses) == 2 and all(torch.isfinite(torch.tensor(v)) for v in result.losses.values())
    assert {p.dtype for p in trained.parameters() if p.requires_grad} == {torch.float32}
