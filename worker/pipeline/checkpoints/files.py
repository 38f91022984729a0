"""Reading checkpoint files safely: tensors only, memory-mapped, and every failure a CheckpointError."""

from __future__ import annotations

import contextlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from worker.pipeline.checkpoints.errors import CheckpointError

SAT_TRACKER = "latest"  # SwissArmyTransformer writes the newest step folder's name here
SAT_MODEL_FILE = "mp_rank_00_model_states.pt"


def _numpy_globals() -> list[Any]:
    """What unpickling a NumPy array needs: SAT's DeepSpeed saves can carry ``np.random.get_state()``."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core  # NumPy 2 renamed numpy.core to numpy._core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


# Decided once: torch < 2.5 has no safe_globals context; such files then fail as "not plain tensors".
_SAFE_GLOBALS = getattr(torch.serialization, "safe_globals", None)


def load_torch_file(path: Path | str) -> dict[str, Any]:
    """``torch.load`` one checkpoint safely: weights only (no pickled code runs), memory-mapped when it can be.

    Memory mapping needs the zip format (every ``torch.save`` since torch 1.6) and keeps the unused parts of a
    26 GB release file (T5, the VAE copy) on disk. A truncated or corrupt file becomes a :class:`CheckpointError`.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "missing", "a file written by torch.save")
    mmap = zipfile.is_zipfile(path)  # also False for a zip cut short (its directory sits at the end)
    context = _SAFE_GLOBALS(_numpy_globals()) if _SAFE_GLOBALS is not None else contextlib.nullcontext()
    try:
        with context:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        if "weights_only" in str(exc) or "Weights only" in str(exc):
            first_line = str(exc).strip().splitlines()[0]
            raise CheckpointError(
                path,
                f"holds pickled objects other than tensors and plain containers, not loaded for safety ({first_line})",
                "a checkpoint of tensors, numbers, strings and containers",
            ) from exc
        raise CheckpointError(path, f"is corrupt ({exc})", "a complete file written by torch.save") from exc
    except Exception as exc:  # torch raises RuntimeError, EOFError, ValueError... depending on where a file is cut
        raise CheckpointError(
            path, f"cannot be read, truncated or corrupt ({type(exc).__name__}: {exc})", "a complete torch.save file"
        ) from exc
    if not isinstance(obj, dict):
        raise CheckpointError(path, f"holds a {type(obj).__name__}", "a dict (torch.save of a checkpoint dict)")
    return obj


def resolve_decoder_file(path: Path | str) -> Path:
    """The model-states file of a SAT checkpoint directory (through its ``latest``), or ``path`` if it is that file."""
    path = Path(path)
    if not path.is_dir():
        if not path.is_file():
            raise CheckpointError(path, "missing", f"a SAT checkpoint directory or its {SAT_MODEL_FILE}")
        return path
    latest = path / SAT_TRACKER
    if not latest.is_file():
        raise CheckpointError(latest, "missing", "a text file naming the step folder (SAT layout)")
    try:
        step = latest.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(latest, f"cannot be read ({exc})", "a text file naming the step folder") from exc
    if not step or Path(step).name != step or step in {".", ".."}:
        raise CheckpointError(latest, f"holds {step!r}", "the name of a step folder beside it, such as '1000'")
    file = path / step / SAT_MODEL_FILE
    if not file.is_file():
        raise CheckpointError(
            file, f"missing, although {latest} names step {step!r}", "the decoder weights of that step"
        )
    return file
