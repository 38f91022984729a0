"""The one task: a TurnRequest in, a TurnResult out, progress as task state.

The pipeline lives on the Task instance, created once per worker process, so the model is
loaded once per pool child, as it starts (``animegamer worker``), and never per task. torch is
imported only when the pipeline is needed.

Past turns' representations may arrive, and the clip and representation leave, by reference
into the shared blob store (``relay.blob_store``); a blob that is missing or damaged fails the
turn with a message naming the file.

Before it computes anything the task takes the job's claim (``relay.control``): a turn that
was cancelled, or that another delivery of the same message already holds or finished, is
dropped with ``Ignore`` (nothing stored, the message acknowledged). While it runs, a heartbeat
thread renews the claim, and every progress report checks the cancel mark, so a cancelled
turn stops at its next denoising step. The claim is marked ended once Celery has stored the
outcome (``task_postrun``), so the bot never sees an ended claim without its result.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from celery import Task, shared_task, signals
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from pydantic import ValidationError

from game.contract import PROGRESS_STATE, TASK_NAME, Progress, Stage, TurnRequest
from game.instruction import parse
from game.proof import proof_of
from relay.blob_store import BlobStore, store_for
from relay.celery_app import BrokerUnavailable, check_broker, served_queues
from relay.control import Claim, JobControl, Presence, control_for
from relay.settings import get_settings
from worker.liveness import TurnWatch
from worker.metrics import observe_turn

if TYPE_CHECKING:
    from worker.pipeline.pipeline import AnimeGamerPipeline

log = logging.getLogger(__name__)

ANY_CHARACTER = "*"  # random-weight and toy models are no one character's (pipeline.ANY_CHARACTER)
PROGRESS_EVERY_SECONDS = 0.2  # a result-store write per denoising step would slow small models


class InvalidTurnRequest(ValueError):
    """The request does not follow the contract; retrying cannot help."""


class TurnCancelled(RuntimeError):
    """The player cancelled the turn while it ran; raised from the progress callback to stop the loop."""


class TurnTooLong(RuntimeError):
    """The turn ran past its time limit."""


class ClaimLost(RuntimeError):
    """Another worker holds this turn's claim now; raised from the progress callback to stop computing it."""


class Stopping(RuntimeError):
    """This process was asked to stop (SIGTERM); raised from the progress callback to hand the turn back."""


# systemd's default KillMode=control-group sends SIGTERM to every process of the worker at once. A pool child
# that dies of it mid-turn is a failed turn to Celery (WorkerLostError); so while a turn runs, SIGTERM only sets
# ``stopping`` and the turn is handed back at its next step, while the parent shuts down warm. Idle, the child
# exits at once, as billiard's own handler would have it.
computing = threading.Event()
stopping = threading.Event()


def stop_at_next_step(signum: int, frame: Any) -> None:
    if not computing.is_set():
        raise SystemExit(-signum)
    stopping.set()


def _hand_back_on_sigterm() -> None:
    """Installed per turn: billiard resets a child's handlers after its initializer, so not at start."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop_at_next_step)


class Heartbeat:
    """A thread that renews this process's claims and its presence, every third of its claims' length.

    It runs beside the turn, so a turn busy in one long GPU call still keeps its claim; a
    process that dies stops renewing, and its claims lapse after one length. A turn that has
    reported no step for the stall limit is renewed no more (``worker/liveness.py``): stuck, it
    would otherwise hold its turn until the hard time limit.
    """

    def __init__(
        self, control: JobControl, owner: str, claim_seconds: float, queues: list[str], model: str, watch: TurnWatch
    ) -> None:
        self.control, self.owner, self.claim_seconds, self.watch = control, owner, claim_seconds, watch
        self.presence = Presence(owner, tuple(queues), model)  # what the bot and `animegamer check` see of it
        self.holding: set[str] = set()
        self.lost: set[str] = set()  # claims another worker took (this one was frozen or cut off past its claim)
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="animegamer-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.watch.round_began()
            try:
                lost = self.control.renew(list(self.holding - self.watch.stalled()), self.owner, self.claim_seconds)
                for task_id in lost:
                    log.warning("turn %s: its claim is another worker's now; stopping it at the next step", task_id)
                    self.holding.discard(task_id)
                self.lost |= lost
                self.control.announce(self.presence, self.claim_seconds)
            except Exception as exc:  # a store that is down now may be back at the next beat
                log.warning("heartbeat not recorded: %s", exc)
            finally:
                self.watch.round_ended()
            self._wake.wait(self.claim_seconds / 3)


class PipelineTask(Task):
    """Holds this process's pipelines (one for any character, or one per served character's pair)."""

    _pipelines: dict[str, AnimeGamerPipeline] | None = None
    _heartbeat: Heartbeat | None = None
    _watch: TurnWatch | None = None
    _control: JobControl | None = None
    _blobs: BlobStore | None = None

    @property
    def pipelines(self) -> dict[str, AnimeGamerPipeline]:
        if self._pipelines is None:
            import torch

            from worker.pipeline.loading import load_pipelines, tune_sampler
            from worker.safety import load_checker

            settings = get_settings()
            pipelines = load_pipelines(
                settings.model,
                settings.characters,
                device=settings.device,
                num_steps=settings.num_steps or None,
                checkpoints=settings.checkpoints,
                offload_mllm=settings.offload_mllm,
                offload_decoder=settings.offload_decoder,
            )
            tune_sampler(
                pipelines,
                skip_unconditional_below=settings.skip_unconditional_below,
                step_cache_below=settings.step_cache_below,
            )
            checker = load_checker(threads=torch.get_num_threads())  # one detector for every pipeline of this process
            for pipeline in pipelines.values():
                pipeline.safety_checker = checker
            self._pipelines = {character.casefold(): pipeline for character, pipeline in pipelines.items()}
        return self._pipelines

    def pipeline_for(self, character: str) -> AnimeGamerPipeline:
        pipelines = self.pipelines
        found = pipelines.get(character.casefold()) or pipelines.get(ANY_CHARACTER)
        if found is None:
            raise InvalidTurnRequest(f"This worker serves {', '.join(pipelines)}, not {character}.")
        return found

    @property
    def control(self) -> JobControl:
        if self._control is None:
            settings = get_settings()
            self._control = control_for(settings.result_backend, settings.broker_timeout)
        return self._control

    @property
    def blobs(self) -> BlobStore:
        if self._blobs is None:
            self._blobs = store_for(get_settings())
        return self._blobs

    @property
    def watch(self) -> TurnWatch:
        """This process's turn and heartbeat, as /livez reads them (made before the first turn, for the endpoint)."""
        if self._watch is None:
            self._watch = TurnWatch(get_settings().worker_stall_seconds)
        return self._watch

    @property
    def heartbeat(self) -> Heartbeat:
        """Started on first use in each process (a forked pool child gets a thread of its own)."""
        if self._heartbeat is None:
            settings = get_settings()
            owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
            queues = served_queues(settings)
            self._heartbeat = Heartbeat(self.control, owner, settings.claim_seconds, queues, settings.model, self.watch)
            self._heartbeat.start()
        return self._heartbeat

    def reset_after_fork(self) -> None:
        """A forked child must not share its parent's store connections or heartbeat thread."""
        if self._control is not None:
            self._control.close()
        self._control = None
        self._heartbeat = None
        self._watch = None


@shared_task(bind=True, base=PipelineTask, name=TASK_NAME)
def generate_turn(self: PipelineTask, request: dict[str, Any]) -> dict[str, Any]:
    try:
        turn = TurnRequest.model_validate(request)
    except ValidationError as exc:
        raise InvalidTurnRequest(
            f"Invalid turn request: {exc.error_count()} error(s): {exc.errors()[0]['msg']}"
        ) from exc

    task_id: str = self.request.id
    heartbeat = self.heartbeat
    claim = self.control.claim(task_id, heartbeat.owner, heartbeat.claim_seconds)
    if claim is not Claim.CLAIMED:
        log.info("turn %s (job %s) not run: %s", task_id, turn.job_id, claim)
        raise Ignore()
    heartbeat.holding.add(task_id)
    log.info("job %s started (task %s)", turn.job_id, task_id)
    _hand_back_on_sigterm()
    computing.set()
    try:
        return _compute(self, turn, task_id, heartbeat)
    finally:
        computing.clear()
        heartbeat.watch.ended(task_id)


def _compute(task: PipelineTask, turn: TurnRequest, task_id: str, heartbeat: Heartbeat) -> dict[str, Any]:
    turn = task.blobs.resolve_request(turn)  # BlobError names the file: the turn fails with it

    last_report = 0.0

    def report(stage: Stage, step: int, total: int) -> None:
        # Every report is a place to stop: the pipeline calls it between stages and after each step.
        nonlocal last_report
        if stage != Stage.LOADING:
            heartbeat.watch.stepped(task_id)
        if task_id in heartbeat.lost:
            raise ClaimLost(task_id)
        if stopping.is_set():
            raise Stopping(task_id)
        if _cancelled(task.control, task_id):
            raise TurnCancelled(task_id)
        now = time.monotonic()
        if step in (0, total) or now - last_report >= PROGRESS_EVERY_SECONDS:
            last_report = now
            try:
                progress = Progress(stage=stage, step=step, total=total)
                task.update_state(state=PROGRESS_STATE, meta=progress.model_dump(mode="json"))
            except SoftTimeLimitExceeded:
                raise  # the limit landed while the store was busy: it is the turn's, not the store's
            except Exception as exc:  # progress is for show; a store that is down must not fail the turn
                log.warning("progress of %s not stored: %s", task_id, exc)

    try:
        if task._pipelines is None:
            report(Stage.LOADING, 0, 1)  # only a worker started with --no-preload loads on its first turn
        pipeline = task.pipeline_for(parse(turn.instruction).character)
        heartbeat.watch.stepped(task_id)  # silence counts from here: loading the model is no step
        result = pipeline(turn, on_progress=report)
    except TurnCancelled:
        log.info("turn %s (job %s) cancelled while it ran; stopped", task_id, turn.job_id)
        raise Ignore() from None
    except Stopping:
        heartbeat.holding.discard(task_id)
        try:
            task.control.release(task_id, heartbeat.owner)  # the next worker to get the message may claim it at once
        except Exception as exc:
            log.warning("claim of %s not released (%s); it lapses on its own", task_id, exc)
        log.warning("turn %s (job %s) handed back: this worker is stopping", task_id, turn.job_id)
        raise Reject("the worker is stopping", requeue=True) from None
    except ClaimLost:
        heartbeat.lost.discard(task_id)
        log.warning("turn %s (job %s) lost its claim to another worker; stopped", task_id, turn.job_id)
        raise Ignore() from None
    except SoftTimeLimitExceeded:
        raise TurnTooLong(f"the turn ran past its soft time limit ({task.app.conf.task_soft_time_limit} s)") from None
    if task_id in heartbeat.lost:  # lost after its last step: the result is the new holder's to give
        heartbeat.lost.discard(task_id)
        log.warning("turn %s (job %s) lost its claim to another worker; its result is dropped", task_id, turn.job_id)
        raise Ignore()
    observe_turn(result.timings)
    log.info("job %s done in %.2fs", turn.job_id, sum(result.timings.values()))
    packed = task.blobs.pack_result(result, task_id)
    if turn.ticket:  # what the bot takes as this turn's result, and nobody else's (game/proof.py)
        packed = packed.model_copy(update={"proof": proof_of(turn.ticket, packed)})
    return packed.model_dump(mode="json")


def _cancelled(control: JobControl, task_id: str) -> bool:
    try:
        return control.cancelled(task_id)
    except SoftTimeLimitExceeded:
        raise  # the limit landed while the store was busy: it is the turn's, not the store's
    except Exception as exc:  # the store is down: keep going; the bot ignores a cancelled turn's result
        log.warning("cancel mark of %s unreadable: %s", task_id, exc)
        return False


@signals.task_postrun.connect
def _end_claim(sender: Task | None = None, task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    """After Celery stored the outcome (or ignored the task): the claim is over."""
    if sender is None or sender.name != TASK_NAME or task_id is None or state is None:
        return
    task = sender
    heartbeat = task._heartbeat
    if heartbeat is None or task_id not in heartbeat.holding:
        return  # dropped before claiming: the claim is someone else's
    heartbeat.holding.discard(task_id)
    try:
        if not task.control.end(task_id, heartbeat.owner, keep=float(task.app.conf.result_expires or 86400)):
            log.warning("claim of %s is another worker's; left as it is", task_id)
    except Exception as exc:
        log.warning("claim of %s not marked ended: %s", task_id, exc)


@signals.worker_process_init.connect
def _fresh_child(**_: Any) -> None:
    generate_turn.reset_after_fork()


class BrokerWatch:
    """Whether this worker's broker answers, asked for /readyz at most every ``every`` seconds: a worker that loaded
    its model but cannot reach its queue takes no turns, and must say so rather than look ready."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self._asked = -float("inf")
        self._trouble: str | None = None
        self._lock = threading.Lock()  # the endpoint's thread asks; one check at a time

    def trouble(self) -> str | None:
        """What is wrong with the broker (its URL without the password), or None when it answered."""
        with self._lock:
            if time.monotonic() - self._asked >= self.every:
                try:
                    check_broker(generate_turn.app, timeout=get_settings().broker_timeout)
                    self._trouble = None
                except BrokerUnavailable as exc:
                    self._trouble = str(exc).split(" (", 1)[0]  # "The queue at redis://:**@host/0 does not answer"
                self._asked = time.monotonic()
            return self._trouble


def readiness(model: str, queues: list[str], preload: bool, broker: BrokerWatch) -> tuple[bool, dict[str, Any]]:
    """Ready once the model is loaded with its nudity detector (or, started with --no-preload, as soon as it
    consumes: it loads on the first turn) and its broker answers, saying which model, which characters its pipelines
    play, which detector checks their clips and which queues it consumes."""
    pipelines = generate_turn._pipelines
    trouble = broker.trouble()
    from worker.safety import Missing  # numpy and the detector's code: not needed to import the task

    checker = next(iter(pipelines.values())).safety_checker if pipelines else None
    # A worker without its detector withholds every clip it makes: not ready, so no rollout or autoscaler counts on
    # it (docs/runbook.md, "Clips withheld unchecked").
    checking = not isinstance(checker, Missing)
    ready = (pipelines is not None or not preload) and trouble is None and checking
    report = {
        "ready": ready,
        "model": model,
        "loaded": pipelines is not None,
        "broker": trouble or "answering",
        "characters": sorted(pipelines) if pipelines is not None else [],
        # Which detector checks its clips; without one, every clip it makes is withheld (worker/safety.py).
        "detector": checker.name if checker is not None else "",
        "queues": queues,
    }
    return ready, report
