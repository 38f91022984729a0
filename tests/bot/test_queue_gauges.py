"""The queue's gauges as the supervisor sets them from the jobs it read: how long the oldest turn has waited for a
worker, by queue (what the waiting alert pages on)."""

from __future__ import annotations

from datetime import timedelta

from bot.metrics import BotMetrics
from db.base import utcnow
from db.jobs import JobInfo
from db.models import JobKind, JobStatus
from relay.settings import Settings

SETTINGS = Settings(model="tiny", queue="turns")
LINE = "Character: Qiqi; Motion: wave; Background: town."


def job(job_id: int, queued_minutes_ago: float, sent_minutes_ago: float | None, story_id: int | None = None) -> JobInfo:
    now = utcnow()
    sent = None if sent_minutes_ago is None else now - timedelta(minutes=sent_minutes_ago)
    return JobInfo(
        id=job_id, task_id=f"t{job_id}", kind=JobKind.STORY if story_id else JobKind.ACT, status=JobStatus.QUEUED,
        turn_id=job_id, character_id=1, story_id=story_id, seq=job_id if story_id else None, instruction=LINE,
        model_key=None, progress=0.0, step=0, total=0, guild_id=1, channel_id=2, user_id=job_id,
        progress_message_id=None, result_message_id=None, queued_at=now - timedelta(minutes=queued_minutes_ago),
        started_at=None, sent_at=sent, attempts=1 if sent else 0, deadline_at=None, post_attempts=0,
    )  # fmt: skip


def oldest_wait(jobs: list[JobInfo]) -> float:
    metrics = BotMetrics()
    metrics.queue_depth(SETTINGS, jobs)
    return metrics.registry.get_sample_value("animegamer_queue_oldest_wait_seconds", {"queue": "turns"})


def test_a_turn_not_yet_sent_waits_from_when_it_was_queued() -> None:
    assert 595 <= oldest_wait([job(1, queued_minutes_ago=10, sent_minutes_ago=None)]) <= 605


def test_a_story_turn_waits_only_from_when_it_was_sent_not_while_the_turn_before_it_ran() -> None:
    behind = job(2, queued_minutes_ago=30, sent_minutes_ago=None, story_id=7)
    assert oldest_wait([behind]) == 0
    sent = job(3, queued_minutes_ago=30, sent_minutes_ago=1, story_id=7)
    assert 55 <= oldest_wait([behind, sent]) <= 65


def test_an_empty_queue_has_waited_nothing() -> None:
    assert oldest_wait([]) == 0
