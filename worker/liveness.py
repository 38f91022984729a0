"""Whether this worker is working, not only running: what its /livez answers and whose claims its heartbeat renews.

A pool child can be alive and stuck: a GPU call that never returns, a lock never released, a store call that
hangs. Its endpoint's thread keeps answering /healthz, and before this its heartbeat thread kept renewing the
turn's claim, so the turn waited for the hard time limit (30 minutes by default) while no other worker could take
it. Two measures say which, each on the process's monotonic clock:

- the turn in progress: how long since it last reported a step (the pipeline reports between stages and after
  every denoising step; the model's load before a first turn is not a step and is not counted);
- the heartbeat's round in progress: how long its renewal has run (0 between rounds; each store call in it is
  bounded, so a round that runs long is stuck, not slow).

A turn with no step for ``ANIMEGAMER_WORKER_STALL_SECONDS`` is stalled: the heartbeat stops renewing its claim,
so the claim lapses and the bot hands the turn to another worker, and /livez fails so that an orchestrator restarts
the process. The main thread's stack is logged once per stall: what it is stuck in is what an operator needs.
Neither measure reads Redis or the database: a server that is down makes the worker unready, never dead.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from typing import Any

log = logging.getLogger(__name__)


class TurnWatch:
    """The two measures above, written by the turn's thread and the heartbeat, read by the endpoint's thread."""

    def __init__(self, stall_seconds: float) -> None:
        self.stall_seconds = stall_seconds
        self._step_at: dict[str, float] = {}  # task id -> when its turn last reported a step
        self._round_began: float | None = None
        self._told: set[str] = set()  # the stalls whose stack was logged
        self._telling = threading.Lock()  # the heartbeat and the endpoint both ask
        self._turn_thread: int | None = None

    # -- written by the turn's thread ------------------------------------------------------------------

    def stepped(self, task_id: str) -> None:
        """The turn reported a step (its first one starts the count)."""
        self._turn_thread = threading.get_ident()
        self._step_at[task_id] = time.monotonic()
        self._told.discard(task_id)

    def ended(self, task_id: str) -> None:
        self._step_at.pop(task_id, None)
        self._told.discard(task_id)

    # -- written by the heartbeat ----------------------------------------------------------------------

    def round_began(self) -> None:
        self._round_began = time.monotonic()

    def round_ended(self) -> None:
        self._round_began = None

    # -- read ------------------------------------------------------------------------------------------

    def silent_for(self, task_id: str) -> float:
        """Seconds since the turn's last step (0 for a turn not running here)."""
        step_at = self._step_at.get(task_id)
        return 0.0 if step_at is None else time.monotonic() - step_at

    def stalled(self) -> set[str]:
        """The turns silent for the stall limit or longer; logs the turn thread's stack once for each."""
        stalled = {task_id for task_id in list(self._step_at) if self.silent_for(task_id) >= self.stall_seconds}
        with self._telling:
            untold = stalled - self._told
            self._told |= untold
        for task_id in untold:
            frame = sys._current_frames().get(self._turn_thread or 0)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(not found)\n"
            log.error(
                "turn %s has reported no step for %.0f s: its claim is no longer renewed, so another worker may "
                "take it; turn thread traceback (most recent call last):\n%s",
                task_id,
                self.silent_for(task_id),
                stack.rstrip(),
            )
        return stalled

    def round_seconds(self) -> float:
        began = self._round_began
        return 0.0 if began is None else time.monotonic() - began

    def report(self) -> tuple[bool, dict[str, Any]]:
        """/livez: alive unless a turn or the heartbeat's round has been stuck for the stall limit."""
        stuck = [
            f"turn {task_id} has reported no step for {self.silent_for(task_id):.0f} s"
            for task_id in sorted(self.stalled())
        ]
        if (overrun := self.round_seconds()) >= self.stall_seconds:
            stuck.append(f"the heartbeat's renewal has run for {overrun:.0f} s")
        return not stuck, {
            "live": not stuck,
            "stuck": stuck,
            "turn_silent_seconds": {task_id: round(self.silent_for(task_id), 1) for task_id in list(self._step_at)},
            "heartbeat_round_seconds": round(self.round_seconds(), 1),
            "limit_seconds": self.stall_seconds,
        }
