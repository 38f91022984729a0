"""`python -m tests.faulty_worker [worker options]`: a real `animegamer worker` whose pipeline misbehaves on command.

- A turn whose instruction says "hang" never ends: the pipeline swallows every exception, Celery's soft time
  limit included, so only the hard limit (the prefork pool killing its child) can stop it. That is what a
  turn stuck in a GPU call looks like.
- A turn whose instruction says "slowly" runs the real pipeline with each denoising step taking at least
  ``SLOW_STEP_SECONDS``, so a test has time to act while it runs (cancel it, kill its worker).
- A turn whose instruction says "stranger" returns a real result made for another job id: a result that
  does not fit the job it is delivered for.

Every other turn runs the real pipeline untouched, so a test can also show that play carries on.
"""

from __future__ import annotations

import contextlib
import sys
import time

from animegamer.cli import main
from worker.pipeline.pipeline import AnimeGamerPipeline

SLOW_STEP_SECONDS = 0.2

real_call = AnimeGamerPipeline.__call__


def misbehave_on_request(self, request, on_progress=None):
    report = on_progress or (lambda stage, step, total: None)
    if "hang" in request.instruction:
        report("mllm", 0, 2)
        while True:
            with contextlib.suppress(BaseException):  # deliberately deaf, as a stuck CUDA call is
                time.sleep(1)
    if "slowly" in request.instruction:

        def slow_report(stage: str, step: int, total: int) -> None:
            if stage == "denoise":
                time.sleep(SLOW_STEP_SECONDS)
            report(stage, step, total)

        return real_call(self, request, slow_report)
    if "stranger" in request.instruction:
        return real_call(self, request.model_copy(update={"job_id": "someone-else"}), on_progress)
    return real_call(self, request, on_progress)


AnimeGamerPipeline.__call__ = misbehave_on_request  # patched in the parent: the pool's children inherit it

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
