"""One game on this machine, through the real queue: what `demo` and `play` share.

A local Celery worker process is started on the configured broker (the embedded SQLite one
by default), each turn is sent by task name with the character's history, and the result is
applied with the game's own rules. Clips are written atomically, so a file that exists is
complete. Clips and representations too large for the queue go through the blob folder the
local worker shares (``relay.blob_store``), as they do between the bot and its workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery, states
from celery.result import AsyncResult

from game.contract import (
    PROGRESS_STATE,
    TASK_NAME,
    HistoryTurn,
    Progress,
    ProgressFn,
    Stage,
    TurnRequest,
    TurnResult,
    inline,
)
from game.history import MAX_WINDOW, past_turns_for
from game.instruction import Instruction
from game.state import CharacterState
from relay.blob_store import BlobError, BlobStore, store_for
from relay.settings import Settings

POLL_SECONDS = 0.05


# Ctrl-C is kept as a flag as well as raised. Python raises KeyboardInterrupt wherever the main thread happens to be,
# and raised inside a finalizer (a connection's ``__del__`` or weakref callback, run by the garbage collector) it is
# printed and dropped: the demo then played on after a Ctrl-C (CI, once). The flag makes the next poll raise it again.
_CTRL_C = threading.Event()


def _on_ctrl_c(signum: int, frame: object) -> None:
    _CTRL_C.set()
    raise KeyboardInterrupt


def watch_ctrl_c() -> None:
    """Remember a Ctrl-C until it stops the game; a process that ignores SIGINT (a background job) keeps ignoring it."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_ctrl_c)


def stop_if_ctrl_c() -> None:
    if _CTRL_C.is_set():
        raise KeyboardInterrupt


class TurnFailed(RuntimeError):
    """A turn the worker could not make; the message is meant for the player."""


class SetupError(RuntimeError):
    """Something to fix before a game can start; the message says what."""


def connect(settings: Settings) -> Celery:
    """Check the model name and the queue before starting anything, and return the Celery app."""
    watch_ctrl_c()
    from relay.celery_app import BrokerUnavailable, check_broker, make_celery
    from worker.pipeline.config import UnknownModelError, check_model_name

    app = make_celery(settings)
    try:
        check_model_name(settings.model)
        check_broker(app, settings.broker_timeout)
    except (UnknownModelError, BrokerUnavailable) as exc:
        raise SetupError(str(exc)) from exc
    return app


class WorkerProcess:
    """A `animegamer worker` child process, stopped for sure on exit (Ctrl-C included)."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "animegamer", "worker", "--loglevel", "WARNING"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # Ctrl-C reaches us only; we stop the worker ourselves
        )
        log.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)  # warm shutdown: an unfinished turn goes back to the queue
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def run_turn(
    app: Celery,
    blobs: BlobStore,
    request: TurnRequest,
    queue: str,
    on_progress: ProgressFn | None = None,
    worker: WorkerProcess | None = None,
    timeout: float = 3600.0,
) -> TurnResult:
    """Send one turn by name and wait for it, reporting the worker's progress; its bytes are read back."""
    payload = [blobs.pack_request(request).model_dump(mode="json")]
    async_result: AsyncResult = app.send_task(TASK_NAME, args=payload, task_id=request.job_id, queue=queue)
    deadline = time.monotonic() + timeout
    try:
        while True:
            stop_if_ctrl_c()
            state = async_result.state
            if state == states.SUCCESS:
                try:
                    return blobs.resolve_result(TurnResult.model_validate(async_result.result), async_result.id)
                except BlobError as exc:
                    raise TurnFailed(f"The worker's clip cannot be read: {exc}") from exc
            if state == states.FAILURE:
                raise TurnFailed(f"The worker could not make this turn: {async_result.result}")
            progress = Progress.read(async_result.info) if state == PROGRESS_STATE else None
            if progress is not None and on_progress is not None:
                on_progress(progress.stage, progress.step, progress.total)
            if worker is not None and not worker.alive():
                raise TurnFailed(f"The worker stopped (see {worker.log_path}):\n{worker.log_tail()}")
            if time.monotonic() > deadline:
                raise TurnFailed(f"No result after {timeout:.0f} s.")
            time.sleep(POLL_SECONDS)
    finally:
        if async_result.ready():
            async_result.forget()  # the result store keeps nothing a finished game needs


@dataclass
class LocalGame:
    """One character's game: its state and the past turns the next prompt may see."""

    settings: Settings
    state: CharacterState = field(default_factory=CharacterState)
    history: list[HistoryTurn] = field(default_factory=list)
    turns_played: int = 0
    seed: int = 0

    @property
    def blobs(self) -> BlobStore:
        return store_for(self.settings)

    def request(self, instruction: Instruction) -> TurnRequest:
        return TurnRequest(
            job_id=f"local-{uuid.uuid4().hex}",
            instruction=str(instruction),
            seed=self.seed + self.turns_played,
            history=past_turns_for(self.history, self.settings.history_window),
        )

    def queue(self, instruction: Instruction) -> str:
        from relay.celery_app import queue_for

        return queue_for(self.settings, instruction.character)

    def apply(self, instruction: Instruction, result: TurnResult) -> CharacterState:
        self.state = self.state.apply(result.deltas)
        self.turns_played += 1
        representation = inline(result.representation, "the result's representation")  # run_turn resolved it
        self.history.append(
            HistoryTurn(instruction=str(instruction), representation=representation, deltas=result.deltas)
        )
        del self.history[:-MAX_WINDOW]  # older turns can never be in a prompt again
        return self.state


def bar_progress(bar: Any, prefix: str = "") -> ProgressFn:
    """Show the worker's progress on a tqdm bar: the stage as its description, steps as its count."""

    last: list[tuple[Stage, int, int]] = []

    def show(stage: Stage, step: int, total: int) -> None:
        if last and last[-1] == (stage, step, total):
            return  # the poll saw nothing new; a redraw would only flicker
        last[:] = [(stage, step, total)]
        bar.set_description(f"{prefix}{stage.value}", refresh=False)
        bar.total, bar.n = total, step
        bar.refresh()

    return show


def write_atomically(path: Path, data: bytes) -> None:
    """A reader (or a later run) never sees half a file under its final name."""
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)
