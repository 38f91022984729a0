"""Reading checkpoint files safely: tensors only, memory-mapped, and every failure a CheckpointError."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import pickle
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch

from worker.pipeline.checkpoints.errors import CheckpointError

SAT_TRACKER = "latest"  # SwissArmyTransformer writes the newest step folder's name here
SAT_MODEL_FILE = "mp_rank_00_model_states.pt"
RELEASE_EVERY = 256 * 2**20  # bytes a load reads between two hand-backs of memory it is done with (hand_back)


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


def _libc(name: str, argtypes: list[Any]) -> Any | None:
    """A libc function where there is one to call (Linux; ``malloc_trim`` is glibc's), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


# Decided once.
_MADVISE = _libc("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
_MALLOC_TRIM = _libc("malloc_trim", [ctypes.c_size_t])


def hand_back(path: Path | str) -> None:
    """Give the system what a load is done with: the pages of ``path`` it read (``drop_mapped_pages``) and the
    C heap's free pages (``trim_heap``). Loaders call it every ``RELEASE_EVERY`` bytes they read."""
    drop_mapped_pages(path)
    trim_heap()


def trim_heap() -> None:
    """Return the free pages inside the C heap to the system (glibc's ``malloc_trim``; elsewhere nothing).

    glibc serves allocations under its mmap threshold (which grows to 32 MB as large blocks are freed) from the
    heap and keeps them when freed. A LoRA merge frees a float32 buffer for every bf16 weight it keeps, and the
    holes left between kept weights came to 0.5 GB resident at the end of a full-size load; trimming as the load
    goes hands them back (47 calls, 0.2 s in all, for the MLLM).
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def drop_mapped_pages(path: Path | str) -> int:
    """Hand back the pages of ``path`` that this process has mapped and read; returns the bytes of address range.

    A memory-mapped ``torch.load`` keeps every page a conversion has read resident in this process for as long as
    any tensor of the file lives: converting a 3.4 GB decoder file would otherwise hold the file's pages beside
    the converted copies, a second copy of the weights in resident memory. The pages are clean copies of the
    file, so dropping them loses nothing (the loaders never write to a file's tensors; a page written in place
    would be lost); a tensor read again afterwards reads the file again. Only mappings of
    ``path`` itself are touched (``/proc/self/maps``), so anonymous memory is never dropped. A no-op where
    there is no ``/proc`` or ``madvise`` (it only saves memory, never changes a value).
    """
    if _MADVISE is None or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    target = os.path.realpath(path)
    ranges = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                if len(fields) == 6 and fields[5].rstrip("\n") == target:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    ranges.append((start, end))
    except OSError:
        return 0
    for start, end in ranges:
        _MADVISE(start, end - start, mmap.MADV_DONTNEED)  # a failure (EINVAL, ...) only keeps the pages
    return sum(end - start for start, end in ranges)


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
