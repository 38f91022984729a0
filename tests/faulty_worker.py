"""`python -m tests.faulty_worker [worker options]`: a real `animegamer worker` whose pipeline misbehaves on command.

- A turn whose instruction says "hang" never ends: the pipeline swallows every exception, Celery's soft time
  limit included, so only the hard limit (the prefork pool killing its child) can stop it. That is what a
  turn stuck in a GPU call looks like.
- A turn whose instruction says "slowly" runs the real pipeline with each denoising step taking at least
  ``SLOW_STEP_SECONDS``, so a test has time to act while it runs (cancel it, kill its worker).
- A turn whose instruction says "crawl" is the same at ``CRAWL_STEP_SECONDS`` a step: over a minute, so that it still
  runs after a test has killed, waited out and replaced another worker on a loaded machine.
- A turn whose instruction says "dawdle" runs the real pipeline with every progress write stalling
  ``STORE_STALL_SECONDS`` in the result store, so its soft time limit lands while progress is being stored.
- A turn whose instruction says "stranger" returns a real result made for another job id: a result that
  does not fit the job it is delivered for.
- A turn whose instruction says "flagged" has its middle frame scored by the real detector and then raised to
  ``FLAGGED_SCORE`` for FEMALE_BREAST_EXPOSED: a detector that flags the frame the test chose.
- A turn whose instruction says "blinded" has its detector raise (as a failed onnxruntime session would).

Every other turn runs the real pipeline untouched, so a test can also show that play carries on.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from celery import Task

from animegamer.cli import main
from worker.pipeline.pipeline import AnimeGamerPipeline
from worker.safety import LABELS, NudeNetChecker

SLOW_STEP_SECONDS = 0.2
CRAWL_STEP_SECONDS = 1.5
STORE_STALL_SECONDS = 1.0
FLAGGED_SCORE = 0.97

real_call = AnimeGamerPipeline.__call__
real_update_state = Task.update_state
real_scores = NudeNetChecker.scores
store_stalls = False
instruction = ""  # the turn this pool child computes now (one at a time)


def update_state_stalling(self: Task, *args: Any, **kwargs: Any) -> None:
    """A result store slow enough that a time limit lands inside a progress write."""
    if store_stalls:
        time.sleep(STORE_STALL_SECONDS)
    return real_update_state(self, *args, **kwargs)


def scores_as_told(self: NudeNetChecker, frames):
    """The real detector's scores, then what the turn's instruction asks for."""
    if "blinded" in instruction:
        raise RuntimeError("the detector's session failed")
    scores = real_scores(self, frames)
    if "flagged" in instruction:
        scores[len(frames) // 2, LABELS.index("FEMALE_BREAST_EXPOSED")] = FLAGGED_SCORE
    return scores


def misbehave_on_request(self, request, on_progress=None):
    global instruction
    instruction = request.instruction
    report = on_progress or (lambda stage, step, total: None)
    if "hang" in request.instruction:
        report("mllm", 0, 2)
        while True:
            with contextlib.suppress(BaseException):  # deliberately deaf, as a stuck CUDA call is
                time.sleep(1)
    if "slowly" in request.instruction or "crawl" in request.instruction:
        step_seconds = SLOW_STEP_SECONDS if "slowly" in request.instruction else CRAWL_STEP_SECONDS

        def slow_report(stage: str, step: int, total: int) -> None:
            if stage == "denoise":
                time.sleep(step_seconds)
            report(stage, step, total)

        return real_call(self, request, slow_report)
    if "dawdle" in request.instruction:
        global store_stalls
        store_stalls = True
        try:
            return real_call(self, request, on_progress)
        finally:
            store_stalls = False
    if "stranger" in request.instruction:
        return real_call(self, request.model_copy(update={"job_id": "someone-else"}), on_progress)
    return real_call(self, request, on_progress)


AnimeGamerPipeline.__call__ = misbehave_on_request  # patched in the parent: the pool's children inherit it
Task.update_state = update_state_stalling
NudeNetChecker.scores = scores_as_told

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
