"""Where the release's files live under a checkpoint directory, for one character.

<root>/Mistral-7B-Instruct-v0.1/          Hugging Face directory (config.json, tokenizer.model, weights)
<root>/AnimeGamer/MLLM-<Character>/pytorch_model.bin     the MLLM wrapper's state dict (peft LoRA, resamplers)
<root>/AnimeGamer/VDM_Decoder-<Character>/latest         a file holding the step folder's name
<root>/AnimeGamer/VDM_Decoder-<Character>/<step>/mp_rank_00_model_states.pt   SAT {'module': state_dict}
<root>/vae/3d-vae.pt                                     {'state_dict': ...}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from worker.pipeline.checkpoints.files import resolve_decoder_file

MISTRAL_DIR = "Mistral-7B-Instruct-v0.1"
CHARACTERS = ("Qiqi", "Sosuke")  # the published pairs; each MLLM was adapted with its own decoder


@dataclass(frozen=True)
class CheckpointLayout:
    root: Path
    character: str

    @property
    def mistral_dir(self) -> Path:
        return self.root / MISTRAL_DIR

    @property
    def mllm_file(self) -> Path:
        return self.root / "AnimeGamer" / f"MLLM-{self.character}" / "pytorch_model.bin"

    @property
    def decoder_dir(self) -> Path:
        return self.root / "AnimeGamer" / f"VDM_Decoder-{self.character}"

    @property
    def vae_file(self) -> Path:
        return self.root / "vae" / "3d-vae.pt"

    def decoder_file(self) -> Path:
        """The SAT model-states file that ``latest`` points at."""
        return resolve_decoder_file(self.decoder_dir)
