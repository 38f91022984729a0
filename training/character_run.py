"""A new character from a prepared data set, over a published one: inputs, phases (a), (b) and (c), the export.

``train_character`` runs the whole way; rerun it with the same arguments to resume. Each stage leaves its result in
the run's folder and a rerun takes it up from there: the inputs file (``training.character_inputs``), each
phase's last saved state (``training.loop``: a finished phase reloads its weights and trains no step), the export.

Where training starts: the published character named as the base (``Qiqi`` by default), since a few hundred clips
cannot teach a 7B MLLM and a 2B decoder from nothing. The decoder starts as the base's (its LoRA merged, as the
worker loads it) with a fresh LoRA (peft starts B at zero, so step 0 is the base exactly); the MLLM starts as the
base's on the shared Mistral weights: its norms, embeddings and resamplers, and its LoRA pairs copied into peft's.
The export then holds the new LoRA over the same Mistral base, served beside the published characters.

1. inputs: the VAE's latents and the frozen T5 / OpenCLIP features of every clip (run once, then freed);
2. phase (a): the decoder learns the clips from their T5 / OpenCLIP features through its own projections;
3. phase (b)'s targets: each clip's representation as phase (a)'s projections make it (226 x D);
4. phase (b): the MLLM learns those representations and the annotated state changes, windows of 1..5 turns;
5. phase (c): the decoder goes on from (a) on the representations the trained MLLM predicts;
6. the export: ``MLLM-<Name>`` and ``VDM_Decoder-<Name>`` in the release's layout under the checkpoint root.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import parse_flag_from_env
from tqdm.auto import tqdm

from training.character_decoder import DecoderPhase, clip_condition, stack, trainable_decoder
from training.character_inputs import INPUTS, read_inputs, write_inputs
from training.character_phase_b import RepresentationAndStates, keyed_windows, trainable
from training.config import TrainConfig
from training.dataset import MANIFEST, DatasetError
from training.frozen_encoders import T5_TOKENIZER_DIR, load_frozen_encoders
from training.loop import train
from training.release_export import export_character
from worker.pipeline.checkpoints.decoder import load_decoder
from worker.pipeline.checkpoints.layout import CheckpointLayout
from worker.pipeline.checkpoints.mllm import load_shared_mllm
from worker.pipeline.checkpoints.vae import load_vae
from worker.pipeline.decoder import AnimeGamerDecoder
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.tokenizer import AnimeGamerTokenizer

logger = logging.getLogger(__name__)

EXPORTED = "export.json"


def _phase(steps: int, batch_size: int, learning_rate: float) -> TrainConfig:
    rates = {"learning_rate": learning_rate, "lr_decay": 0.1}
    return TrainConfig(steps=steps, batch_size=batch_size, eval_every=0, checkpoint_every=100, **rates)


@dataclass(frozen=True)
class CharacterSchedule:
    """Each phase's steps and rates. The release publishes none; these are LoRA fine-tuning's usual rates, for a
    data set of a few hundred clips (about 10 epochs at batch 8 for 300)."""

    a: TrainConfig = field(default_factory=lambda: _phase(400, 8, 1e-4))
    b: TrainConfig = field(default_factory=lambda: _phase(400, 8, 1e-4))
    c: TrainConfig = field(default_factory=lambda: _phase(200, 8, 5e-5))


@dataclass
class CharacterResult:
    layout: CheckpointLayout  # where the character was written
    steps: dict[str, int] = field(default_factory=dict)  # phase -> last step
    losses: dict[str, dict[int, float]] = field(default_factory=dict)  # phase -> step -> loss, this run only
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds, this run


Stage = Callable[[str], None]


def _to_fp32(module: torch.nn.Module) -> None:
    """Trained weights in fp32 whatever the frozen ones are held in (bf16 on a GPU), as ``training.plan`` counts."""
    for param in module.parameters():
        if param.requires_grad:
            param.data = param.data.float()


def base_mllm(
    layout: CheckpointLayout, width: int, dtype: torch.dtype, device: str
) -> tuple[AnimeGamerMLLM, AnimeGamerTokenizer]:
    """The base character's MLLM on the shared Mistral weights, made trainable (phase (b)'s parts) and starting as
    the base: its LoRA pairs copied into peft's (B rescaled from the release's alpha / r to peft's)."""
    tokenizer = AnimeGamerTokenizer.from_checkpoint_dir(layout.mistral_dir)
    files = {layout.character: layout.mllm_file}
    shared = load_shared_mllm(
        layout.mistral_dir, files, vocab_size=tokenizer.vocab_size, representation_dim=width, dtype=dtype, device=device
    )
    mllm, parts = shared.detach(layout.character)
    trainable(mllm)
    with torch.no_grad():
        for path, (lora_a, lora_b) in parts.lora.items():
            layer = mllm.get_submodule(path)
            layer.lora_A["default"].weight.copy_(lora_a)
            layer.lora_B["default"].weight.copy_(lora_b * (parts.scale / layer.scaling["default"]))
    _to_fp32(mllm)
    return mllm, tokenizer


def _check_target(root: Path, name: str, base: str, out: Path) -> CheckpointLayout:
    layout = CheckpointLayout(root, name)
    if name == base:
        raise DatasetError(f"the new character needs a name of its own, not the base's ({base})")
    ours = (out / EXPORTED).is_file() and json.loads((out / EXPORTED).read_text()).get("name") == name
    for path in (layout.mllm_file.parent, layout.decoder_dir):
        if path.exists() and not ours:
            raise DatasetError(f"{path} already exists; choose another name or move it away")
    return layout


def train_character(
    data: Path,
    root: Path,
    name: str,
    out: Path,
    *,
    base: str = "Qiqi",
    schedule: CharacterSchedule | None = None,
    device: str | None = None,
    on_stage: Stage | None = None,
) -> CharacterResult:
    """Train ``name`` on the prepared data set ``data`` over ``base`` under checkpoint ``root``; work in ``out``."""
    data, root, out = Path(data), Path(root), Path(out)
    schedule = schedule or CharacterSchedule()
    # One process, or those `accelerate launch` / torchrun started (each its own GPU). Made here, before the loop's
    # Accelerator, so it has to be told about the CPU as the Accelerator would be (else each process trains alone).
    processes = PartialState(cpu=device == "cpu" or parse_flag_from_env("ACCELERATE_USE_CPU"))
    device = device or str(processes.device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16  # frozen weights; trained ones stay fp32
    if device != "cpu":  # bf16 autocast on a GPU, as the plan counts it (CPUs here have no bf16 matrix unit)
        phases = (schedule.a, schedule.b, schedule.c)
        schedule = CharacterSchedule(*(replace(config, mixed_precision="bf16") for config in phases))
    if not (data / MANIFEST).is_file():
        raise DatasetError(f"{data} has no {MANIFEST}: give a folder written by `animegamer data prepare`")
    layout = CheckpointLayout(root, base)
    result = CharacterResult(_check_target(root, name, base, out))
    out.mkdir(parents=True, exist_ok=True)
    say = on_stage or (lambda text: logger.info("%s", text))
    if not processes.is_main_process:
        say = lambda text: None  # noqa: E731 (one voice for all the processes)

    def timed(stage: str, started: float) -> None:
        result.seconds[stage] = time.monotonic() - started

    # 1. Inputs, once: the VAE and the frozen encoders are freed before any phase loads
    started = time.monotonic()
    with processes.main_process_first():  # the first process encodes; the others read its file
        if not (out / INPUTS).is_file():
            say("encoding the clips (VAE latents, T5 and OpenCLIP features)")
            vae = load_vae(layout.vae_file, dtype=dtype, device=device).eval()
            encoders = load_frozen_encoders(layout.decoder_dir, root / T5_TOKENIZER_DIR).to(device, dtype)
            with tqdm(desc="inputs", unit="clip") as bar:
                write_inputs(data, vae, encoders, out / INPUTS, progress=bar.update)
            del vae, encoders
    clips = read_inputs(out / INPUTS)
    keys = sorted(clips)
    timed("inputs", started)

    # 2. Phase (a): the decoder from the clips' frozen features
    started = time.monotonic()
    decoder: AnimeGamerDecoder = load_decoder(layout.decoder_dir, dtype=dtype, device=device)
    torch.manual_seed(schedule.a.seed)  # peft draws the new LoRA's A from the global generator
    trainable_decoder(decoder, "a")
    _to_fp32(decoder)
    samples = [{f: clips[k][f] for f in ("latents", "flow", "text", "image")} for k in keys]
    sizes = {"character": name, "base": base, "hidden": decoder.hidden_size, "clips": len(keys)}
    say(f"phase (a): {schedule.a.steps} steps over {len(keys)} clips, {processes.num_processes} process(es)")
    done, phase, _ = train(DecoderPhase(decoder), samples, None, stack, schedule.a, out / "phase_a", sizes, None, "a")
    decoder = phase.decoder
    result.steps["a"], result.losses["a"] = done.step, done.losses
    timed("a", started)

    # 3. Phase (b)'s targets: the representation phase (a)'s projections make of each clip
    with torch.no_grad():
        weight = decoder.text_proj[0].weight
        targets = {
            k: clip_condition(decoder, clips[k]["text"][None].to(weight), clips[k]["image"][None].to(weight))[0].cpu()
            for k in keys
        }

    # 4. Phase (b): the MLLM
    started = time.monotonic()
    torch.manual_seed(schedule.b.seed)
    mllm, tokenizer = base_mllm(layout, decoder.hidden_size, dtype, device)
    windows = keyed_windows(data, targets)
    say(f"phase (b): {schedule.b.steps} steps over {len(windows)} windows of 1..5 turns")
    model = RepresentationAndStates(mllm, tokenizer)
    done, model, _ = train(model, list(windows.values()), None, list, schedule.b, out / "phase_b", sizes, None, "b")
    result.steps["b"], result.losses["b"] = done.step, done.losses
    timed("b", started)

    # 5. Phase (c): the decoder on the trained MLLM's own predictions
    started = time.monotonic()
    model.eval()
    predicted = {k: model.predict(window).cpu() for k, window in windows.items()}
    trainable_decoder(decoder, "c")
    samples = [{"latents": clips[k]["latents"], "flow": clips[k]["flow"], "condition": predicted[k]} for k in keys]
    say(f"phase (c): {schedule.c.steps} steps over {len(keys)} clips")
    done, phase, _ = train(DecoderPhase(decoder), samples, None, stack, schedule.c, out / "phase_c", sizes, None, "c")
    result.steps["c"], result.losses["c"] = done.step, done.losses
    timed("c", started)

    # 6. The release's layout, beside the published characters (written once, by the first process)
    if processes.is_main_process:
        result.layout = export_character(root, name, model.mllm, phase.decoder, step=done.step)
        record = {"name": name, "base": base, "steps": result.steps, "schedule": asdict(schedule)}
        (out / EXPORTED).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        say(f"wrote {result.layout.mllm_file.parent} and {result.layout.decoder_dir}")
    processes.wait_for_everyone()
    return result
