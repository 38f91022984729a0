"""One error for every checkpoint problem, naming the file and what was expected there."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(RuntimeError):
    """A missing, truncated or mismatched checkpoint file; nothing was half-loaded."""

    def __init__(self, path: Path | str, problem: str, expected: str = "") -> None:
        self.path = Path(path)
        self.problem = problem
        self.expected = expected
        message = f"{self.path}: {problem}"
        if expected:
            message += f"; expected {expected}"
        super().__init__(message)
