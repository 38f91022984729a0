"""Write tiny checkpoints in exactly the release's SAT layout, from modules whose weights the tests know.

Written from the SAT side (the release's ``dit_video_concat.py``, SAT's ``transformer.py`` and ``lora2.py``, the
release's ``vae_modules/cp_enc_dec.py``) by walking our modules attribute by attribute, independently of the
loaders' rule tables, so that a mistake in one is not repeated in the other.

The LoRA split has to be exact for "loading reproduces the module" to be an exact test: with weights on a
2^-8 grid (:func:`randomize_on_grid_`), integer ``matrix_A`` entries, ``matrix_B`` on the same grid and a
power-of-two rank, ``original = W - B @ A / r`` and ``original + B @ A / r`` are both exact in float32.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLCogVideoX
from peft import LoraConfig, inject_adapter_in_model
from torch import nn
from transformers import T5Config, T5EncoderModel

from training.frozen_encoders import T5_PREFIX, VISION_PREFIX, OpenCLIPVision, VisionConfig
from training.release_export import DIT, NamedState, decoder_release_state
from training.release_export import save_release_decoder as save_training_export
from worker.pipeline.decoder import AnimeGamerDecoder

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # SAT's fused query_key_value and dense
RELEASE_LORA_RANK = 64  # the release's cogvideox_2b.yaml: lora_config r: 64 (lora_alpha left at 1)
GRID = 2.0**-8


@torch.no_grad()
def randomize_on_grid_(module: nn.Module, seed: int) -> nn.Module:
    """Random weights in [-1/8, 1/8] on a 2^-8 grid, norms included, so that swapped tensors change the output."""
    g = torch.Generator().manual_seed(seed)
    for param in module.parameters():
        param.copy_(torch.randint(-32, 33, param.shape, generator=g).to(param.dtype) * GRID)
    return module


def with_release_lora(decoder: AnimeGamerDecoder, rank: int, g: torch.Generator) -> AnimeGamerDecoder:
    """A copy of ``decoder`` holding the same weights as a trained one holds them: peft's LoRA on q, k, v and the
    attention output, base = W - B @ A / r, with integer A and B on the grid so that the split is exact."""
    assert rank & (rank - 1) == 0, "a power-of-two rank keeps the split exact"
    lora = copy.deepcopy(decoder)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=1, target_modules=LORA_TARGETS), lora)
    with torch.no_grad():
        for block in lora.transformer_blocks:
            attn = block.attn1
            for layer in (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0]):
                weight = layer.base_layer.weight
                a = torch.randint(-1, 2, (rank, weight.shape[1]), generator=g).float()  # matrix_A (r, in)
                b = torch.randint(-2, 3, (weight.shape[0], rank), generator=g).float() * GRID  # matrix_B (out, r)
                delta = (b.double() @ a.double()) / rank  # lora_alpha (1) / r
                original = (weight.double() - delta).float()
                assert torch.equal(original.double() + delta, weight.double()), "weights must lie on the grid"
                weight.copy_(original)
                layer.lora_A["default"].weight.copy_(a)
                layer.lora_B["default"].weight.copy_(b)
    return lora


def decoder_sat_state(
    decoder: AnimeGamerDecoder, *, rank: int = RELEASE_LORA_RANK, seed: int = 0, extras: bool = True
) -> dict[str, torch.Tensor]:
    """The ``module`` dict the release's SATVideoDiffusionEngine would save for these weights, written by the
    training's exporter (training/release_export.py) from a LoRA split of them.

    ``extras`` adds what the release file holds besides the DiT weights the loader needs: the position table,
    the unused ``output_mix_layer_norm``, the frozen T5 (``conditioner``) and OpenCLIP encoders whole, at the
    decoder's input widths (:func:`frozen_encoder_state`), and a few VAE (``first_stage_model``) tensors.
    """
    g = torch.Generator().manual_seed(seed)
    state = decoder_release_state(with_release_lora(decoder, rank, g))
    d = decoder.hidden_size
    if extras:
        state[DIT + "mixins.pos_embed.pos_embedding"] = torch.randn(1, 226 + 5 * 4 * 6, d, generator=g)
        state[DIT + "mixins.patch_embed.output_mix_layer_norm.weight"] = torch.ones(d)
        state[DIT + "mixins.patch_embed.output_mix_layer_norm.bias"] = torch.zeros(d)
        state.update(frozen_encoder_state(decoder.text_proj[0].in_features, decoder.ip_proj[0].in_features, seed))
        state["first_stage_model.decoder.conv_in.conv.weight"] = torch.randn(4, 4, 3, 3, 3, generator=g)
        state["first_stage_model.encoder.conv_in.conv.bias"] = torch.randn(4, generator=g)
    return state


T5_VOCAB = 384  # ByT5's tokenizer, which needs no vocabulary file: the tiny tree's t5-v1_1-xxl


def tiny_frozen_encoders(text_width: int, image_width: int, seed: int = 0) -> tuple[T5EncoderModel, OpenCLIPVision]:
    """A random T5 v1.1 encoder and OpenCLIP image tower whose outputs are ``text_width`` and ``image_width`` wide."""
    torch.manual_seed(seed)
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=T5_VOCAB,
            d_model=text_width,
            d_kv=8,
            d_ff=2 * text_width,
            num_layers=2,
            num_heads=2,
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
        )
    )
    vision = OpenCLIPVision(VisionConfig(width=image_width, layers=3, heads=max(1, image_width // 64)))
    with torch.no_grad():
        for param in vision.parameters():
            param.normal_(0, 0.2 if param.ndim > 1 else 0.02)
    return t5.eval(), vision.eval()


def frozen_encoder_state(text_width: int, image_width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The release file's ``conditioner.*`` and ``clip_img_encoder.*`` tensors for :func:`tiny_frozen_encoders`,
    with open_clip's ``ln_post`` and ``proj``, which the penultimate features never reach."""
    t5, vision = tiny_frozen_encoders(text_width, image_width, seed)
    state = {T5_PREFIX + k: v.clone() for k, v in t5.state_dict().items()}
    state.update({VISION_PREFIX + k: v.clone() for k, v in vision.state_dict().items()})
    state[VISION_PREFIX + "ln_post.weight"] = torch.ones(image_width)
    state[VISION_PREFIX + "ln_post.bias"] = torch.zeros(image_width)
    state[VISION_PREFIX + "proj"] = torch.zeros(image_width, 8)
    return state


def save_release_decoder(module_state: dict[str, torch.Tensor], directory: Path, *, step: int = 1000) -> Path:
    """``<directory>/latest`` + ``<directory>/<step>/mp_rank_00_model_states.pt``, as SAT's DeepSpeed save writes.

    The file carries SAT's client state beside ``module`` (iteration and RNG states, a NumPy array among them),
    which a weights-only load has to accept.
    """
    client = {
        "random_rng_state": random.Random(0).getstate(),
        "np_rng_state": np.random.RandomState(0).get_state(),
        "torch_rng_state": torch.Generator().manual_seed(0).get_state(),
    }
    return save_training_export(module_state, directory, step, client)


def write_release_decoder(decoder: AnimeGamerDecoder, directory: Path, *, step: int = 1000, seed: int = 0) -> Path:
    """Both files of a release decoder checkpoint for ``decoder``'s weights; returns the model-states file."""
    return save_release_decoder(decoder_sat_state(decoder, seed=seed), directory, step=step)


def vae_sat_state(vae: AutoencoderKLCogVideoX, *, extras: bool = True) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of CogVideoX's ``3d-vae.pt`` for these weights (SAT/sgm names, cp_enc_dec.py)."""
    w = NamedState(vae)
    resnet = {"conv_shortcut": "nin_shortcut"}  # sgm's 1x1x1 shortcut conv

    enc = vae.encoder
    w.module_("encoder.conv_in.", enc.conv_in)
    for i, down in enumerate(enc.down_blocks):
        for j, block in enumerate(down.resnets):
            w.module_(f"encoder.down.{i}.block.{j}.", block, resnet)
        if down.downsamplers is not None:
            w.module_(f"encoder.down.{i}.downsample.", down.downsamplers[0])
    w.module_("encoder.mid.block_1.", enc.mid_block.resnets[0], resnet)
    w.module_("encoder.mid.block_2.", enc.mid_block.resnets[1], resnet)
    w.module_("encoder.norm_out.", enc.norm_out)
    w.module_("encoder.conv_out.", enc.conv_out)

    dec = vae.decoder
    w.module_("decoder.conv_in.", dec.conv_in)
    w.module_("decoder.mid.block_1.", dec.mid_block.resnets[0], resnet)
    w.module_("decoder.mid.block_2.", dec.mid_block.resnets[1], resnet)
    for k, up in enumerate(dec.up_blocks):
        level = len(dec.up_blocks) - 1 - k  # sgm's up[level], level 0 = full resolution, runs last
        for j, block in enumerate(up.resnets):
            w.module_(f"decoder.up.{level}.block.{j}.", block, resnet)
        if up.upsamplers is not None:
            w.module_(f"decoder.up.{level}.upsample.", up.upsamplers[0])
    w.module_("decoder.norm_out.", dec.norm_out)
    w.module_("decoder.conv_out.", dec.conv_out)
    w.check_complete()

    if extras:  # the training loss the file ships with
        w.put("loss.logvar", torch.zeros(()))
        w.put("loss.discriminator.blocks.0.weight", torch.randn(4, 3, 3, 3))
        w.put("loss.perceptual_loss.net.slice1.0.weight", torch.randn(4, 3, 3, 3))
    return w.tensors


def write_release_vae(vae: AutoencoderKLCogVideoX, path: Path) -> Path:
    """``3d-vae.pt`` for ``vae``'s weights: ``{'state_dict': ...}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": vae_sat_state(vae)}, path)
    return path
