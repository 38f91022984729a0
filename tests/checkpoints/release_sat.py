"""Write tiny checkpoints in exactly the release's SAT layout, from modules whose weights the tests know.

Written from the SAT side (the release's ``dit_video_concat.py``, SAT's ``transformer.py`` and ``lora2.py``, the
release's ``vae_modules/cp_enc_dec.py``) by walking our modules attribute by attribute, independently of the
loaders' rule tables, so that a mistake in one is not repeated in the other.

The LoRA split has to be exact for "loading reproduces the module" to be an exact test: with weights on a
2^-8 grid (:func:`randomize_on_grid_`), integer ``matrix_A`` entries, ``matrix_B`` on the same grid and a
power-of-two rank, ``original = W - B @ A / r`` and ``original + B @ A / r`` are both exact in float32.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLCogVideoX
from torch import nn

from worker.pipeline.decoder import AnimeGamerDecoder

DIT = "model.diffusion_model."
RELEASE_LORA_RANK = 64  # the release's cogvideox_2b.yaml: lora_config r: 64 (lora_alpha left at 1)
GRID = 2.0**-8


@torch.no_grad()
def randomize_on_grid_(module: nn.Module, seed: int) -> nn.Module:
    """Random weights in [-1/8, 1/8] on a 2^-8 grid, norms included, so that swapped tensors change the output."""
    g = torch.Generator().manual_seed(seed)
    for param in module.parameters():
        param.copy_(torch.randint(-32, 33, param.shape, generator=g).to(param.dtype) * GRID)
    return module


class _Writer:
    """Collects SAT-named tensors and remembers which of the module's parameters were written."""

    def __init__(self, module: nn.Module) -> None:
        self.state: dict[str, torch.Tensor] = {}
        self.written: set[int] = set()
        self.module = module

    def put(self, name: str, tensor: torch.Tensor) -> None:
        assert name not in self.state, f"written twice: {name}"
        self.state[name] = tensor.detach().clone().contiguous()

    def module_(self, prefix: str, module: nn.Module, renames: dict[str, str] | None = None) -> None:
        """Every tensor of ``module`` under ``prefix``, with its local names optionally renamed."""
        for name, param in module.named_parameters():
            for old, new in (renames or {}).items():
                name = name.replace(old, new)
            self.put(prefix + name, param)
            self.written.add(id(param))

    def mark(self, *params: torch.Tensor) -> None:
        self.written.update(id(p) for p in params)

    def check_complete(self) -> None:
        left = [name for name, p in self.module.named_parameters() if id(p) not in self.written]
        assert not left, f"the writer forgot {left}"


def _lora(w: _Writer, name: str, linears: list[nn.Linear], rank: int, g: torch.Generator) -> None:
    """SAT lora2: ``name.original`` holds the fused weight minus B_i @ A_i / r on each partition's rows."""
    assert rank & (rank - 1) == 0, "a power-of-two rank keeps the split exact"
    originals, biases = [], []
    for i, lin in enumerate(linears):
        a = torch.randint(-1, 2, (rank, lin.in_features), generator=g).float()  # matrix_A.i (r, in)
        b = torch.randint(-2, 3, (lin.out_features, rank), generator=g).float() * GRID  # matrix_B.i (out, r)
        delta = (b.double() @ a.double()) / rank  # lora_alpha (1) / r
        original = (lin.weight.double() - delta).float()
        assert torch.equal(original.double() + delta, lin.weight.double()), "weights must lie on the grid"
        w.put(f"{name}.matrix_A.{i}", a)
        w.put(f"{name}.matrix_B.{i}", b)
        originals.append(original)
        biases.append(lin.bias)
        w.mark(lin.weight, lin.bias)
    w.put(f"{name}.original.weight", torch.cat(originals))  # rows [q; k; v] for the fused projection
    w.put(f"{name}.original.bias", torch.cat(biases))


def decoder_sat_state(
    decoder: AnimeGamerDecoder, *, rank: int = RELEASE_LORA_RANK, seed: int = 0, extras: bool = True
) -> dict[str, torch.Tensor]:
    """The ``module`` dict the release's SATVideoDiffusionEngine would save for these weights.

    ``extras`` adds what the release file holds besides the DiT weights the loader needs: the position table,
    the unused ``output_mix_layer_norm``, and a few T5 (``conditioner``), OpenCLIP and VAE (``first_stage_model``)
    tensors.
    """
    g = torch.Generator().manual_seed(seed)
    w = _Writer(decoder)
    d = decoder.hidden_size

    w.module_(DIT + "mixins.patch_embed.proj.", decoder.patch_embed)
    w.module_(DIT + "time_embed.", decoder.time_embedding, {"linear_1": "0", "linear_2": "2"})
    w.module_(DIT + "flow_embed.", decoder.flow_embedding, {"linear_1": "0", "linear_2": "2"})

    for i, block in enumerate(decoder.transformer_blocks):
        layer = f"{DIT}transformer.layers.{i}."
        w.module_(layer + "input_layernorm.", block.norm1.norm)
        w.module_(layer + "post_attention_layernorm.", block.norm2.norm)
        attn = block.attn1
        _lora(w, layer + "attention.query_key_value", [attn.to_q, attn.to_k, attn.to_v], rank, g)
        _lora(w, layer + "attention.dense", [attn.to_out[0]], rank, g)
        w.module_(layer + "mlp.dense_h_to_4h.", block.ff.net[0].proj)
        w.module_(layer + "mlp.dense_4h_to_h.", block.ff.net[2])
        w.module_(f"{DIT}mixins.adaln_layer.query_layernorm_list.{i}.", attn.norm_q)
        w.module_(f"{DIT}mixins.adaln_layer.key_layernorm_list.{i}.", attn.norm_k)

        # The release's chunk(12) order: video (shift, scale, gate) for attention, then for the MLP, then the same
        # six for the condition ("text") tokens. diffusers' LayerNormZero emits (shift, scale, gate) for the video
        # tokens, then for the condition tokens.
        for kind in ("weight", "bias"):
            attn_video, attn_cond = getattr(block.norm1.linear, kind).chunk(2)
            mlp_video, mlp_cond = getattr(block.norm2.linear, kind).chunk(2)
            fused = torch.cat([attn_video, mlp_video, attn_cond, mlp_cond])
            w.put(f"{DIT}mixins.adaln_layer.adaLN_modulations.{i}.1.{kind}", fused)
        w.mark(*block.norm1.linear.parameters(), *block.norm2.linear.parameters())

    w.module_(DIT + "transformer.final_layernorm.", decoder.norm_final)
    w.module_(DIT + "mixins.final_layer.norm_final.", decoder.norm_out.norm)
    w.module_(DIT + "mixins.final_layer.adaLN_modulation.1.", decoder.norm_out.linear)
    w.module_(DIT + "mixins.final_layer.linear.", decoder.proj_out)
    w.module_(DIT + "mixins.patch_embed.text_proj.", decoder.text_proj)
    w.module_(DIT + "mixins.patch_embed.ip_proj.", decoder.ip_proj)
    w.module_(DIT + "mixins.patch_embed.txt_mix_layer_norm.", decoder.text_norm)
    w.module_(DIT + "mixins.patch_embed.ip_mix_layer_norm.", decoder.ip_norm)
    w.check_complete()

    if extras:
        w.put(DIT + "mixins.pos_embed.pos_embedding", torch.randn(1, 226 + 5 * 4 * 6, d, generator=g))
        w.put(DIT + "mixins.patch_embed.output_mix_layer_norm.weight", torch.ones(d))
        w.put(DIT + "mixins.patch_embed.output_mix_layer_norm.bias", torch.zeros(d))
        w.put("conditioner.embedders.0.transformer.shared.weight", torch.randn(7, 5, generator=g))
        w.put("conditioner.embedders.0.transformer.encoder.final_layer_norm.weight", torch.ones(5))
        w.put("clip_img_encoder.model.visual.conv1.weight", torch.randn(4, 3, 2, 2, generator=g))
        w.put("first_stage_model.decoder.conv_in.conv.weight", torch.randn(4, 4, 3, 3, 3, generator=g))
        w.put("first_stage_model.encoder.conv_in.conv.bias", torch.randn(4, generator=g))
    return w.state


def save_release_decoder(module_state: dict[str, torch.Tensor], directory: Path, *, step: int = 1000) -> Path:
    """``<directory>/latest`` + ``<directory>/<step>/mp_rank_00_model_states.pt``, as SAT's DeepSpeed save writes.

    The file carries SAT's client state beside ``module`` (iteration and RNG states, a NumPy array among them),
    which a weights-only load has to accept.
    """
    file = directory / str(step) / "mp_rank_00_model_states.pt"
    file.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {
        "module": module_state,
        "iteration": step,
        "random_rng_state": random.Random(0).getstate(),
        "np_rng_state": np.random.RandomState(0).get_state(),
        "torch_rng_state": torch.Generator().manual_seed(0).get_state(),
    }
    torch.save(checkpoint, file)
    (directory / "latest").write_text(str(step))
    return file


def write_release_decoder(decoder: AnimeGamerDecoder, directory: Path, *, step: int = 1000, seed: int = 0) -> Path:
    """Both files of a release decoder checkpoint for ``decoder``'s weights; returns the model-states file."""
    return save_release_decoder(decoder_sat_state(decoder, seed=seed), directory, step=step)


def vae_sat_state(vae: AutoencoderKLCogVideoX, *, extras: bool = True) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of CogVideoX's ``3d-vae.pt`` for these weights (SAT/sgm names, cp_enc_dec.py)."""
    w = _Writer(vae)
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
    return w.state


def write_release_vae(vae: AutoencoderKLCogVideoX, path: Path) -> Path:
    """``3d-vae.pt`` for ``vae``'s weights: ``{'state_dict': ...}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": vae_sat_state(vae)}, path)
    return path
