"""The one task: a TurnRequest in, a TurnResult out, progress as task state.

The pipeline lives on the Task instance, which Celery creates once per worker process, so the
model is loaded on the first turn (or at worker start, see ``animegamer worker``) and never per
task. torch is imported only when the pipeline is first needed.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from celery import Task
from pydantic import ValidationError

from animegamer.settings import get_settings
from game.contract import TASK_NAME, TurnRequest
from game.instruction import parse
from worker.celery_app import RELEASE_MODEL, app

if TYPE_CHECKING:
    from worker.pipeline.pipeline import AnimeGamerPipeline

log = logging.getLogger(__name__)

ANY_CHARACTER = "*"  # random-weight models are no character's
PROGRESS_EVERY_SECONDS = 0.2  # a result-store write per denoising step would slow small models


class InvalidTurnRequest(ValueError):
    """The request does not follow the contract; retrying cannot help."""


class PipelineTask(Task):
    """Holds this process's pipelines: one for random weights, or one per served character's pair."""

    _pipelines: dict[str, AnimeGamerPipeline] | None = None

    @property
    def pipelines(self) -> dict[str, AnimeGamerPipeline]:
        if self._pipelines is None:
            from worker.pipeline.pipeline import load_pipeline

            settings = get_settings()
            characters = settings.characters if settings.model == RELEASE_MODEL else [ANY_CHARACTER]
            self._pipelines = {
                character.casefold(): load_pipeline(
                    settings.model,
                    device=settings.device,
                    num_steps=settings.num_steps or None,
                    checkpoints=settings.checkpoints,
                    character=character,
                    offload=settings.offload_mllm,
                )
                for character in characters
            }
        return self._pipelines

    def pipeline_for(self, character: str) -> AnimeGamerPipeline:
        pipelines = self.pipelines
        found = pipelines.get(character.casefold()) or pipelines.get(ANY_CHARACTER)
        if found is None:
            raise InvalidTurnRequest(f"This worker serves {', '.join(pipelines)}, not {character}.")
        return found


@app.task(bind=True, base=PipelineTask, name=TASK_NAME)
def generate_turn(self: PipelineTask, request: dict[str, Any]) -> dict[str, Any]:
    try:
        turn = TurnRequest.model_validate(request)
    except ValidationError as exc:
        raise InvalidTurnRequest(
            f"Invalid turn request: {exc.error_count()} error(s): {exc.errors()[0]['msg']}"
        ) from exc

    last_report = 0.0

    def report(stage: str, step: int, total: int) -> None:
        nonlocal last_report
        now = time.monotonic()
        if step in (0, total) or now - last_report >= PROGRESS_EVERY_SECONDS:
            last_report = now
            self.update_state(state="PROGRESS", meta={"stage": stage, "step": step, "total": total})

    if self._pipelines is None:
        report("loading", 0, 1)  # only the first turn of a worker that was started with --no-preload
    result = self.pipeline_for(parse(turn.instruction).character)(turn, on_progress=report)
    log.info("turn %s done in %.2fs", turn.job_id, sum(result.timings.values()))
    return result.model_dump(mode="json")
