"""The history window: which past turns the MLLM sees.

A window of N means the prompt holds the current turn and up to N - 1 past turns, oldest
first. The release runs with N = 1 (no past turns) although it trained on 1..5 turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

DEFAULT_WINDOW = 1
MAX_WINDOW = 5  # the longest history the model was trained on

T = TypeVar("T")


def past_turns_for(turns: Sequence[T], window: int = DEFAULT_WINDOW) -> list[T]:
    """The past turns (oldest first) that go into the next prompt."""
    if not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"history window must be 1..{MAX_WINDOW}, got {window}")
    keep = window - 1
    return list(turns[-keep:]) if keep else []
