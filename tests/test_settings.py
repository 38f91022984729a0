"""Settings an operator writes: shard ranges for a fleet of bot processes, refused with the fix when they cannot
work."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relay.settings import Settings, settings_at_odds
from tests.test_secrets import check_with


def settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings(_env_file=None)


def test_one_process_connects_every_shard_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings(monkeypatch, SHARD_COUNT="4").shard_ids is None


@pytest.mark.parametrize(("written", "ids"), [("0-3", [0, 1, 2, 3]), ("4,6", [4, 6]), ("0-1, 5, 7-8", [0, 1, 5, 7, 8])])
def test_shard_ids_are_written_as_numbers_and_ranges(monkeypatch: pytest.MonkeyPatch, written: str, ids: list) -> None:
    assert settings(monkeypatch, SHARD_COUNT="9", SHARD_IDS=written).shard_ids == ids


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"SHARD_IDS": "0-1"}, "SHARD_IDS needs SHARD_COUNT"),
        ({"SHARD_COUNT": "4", "SHARD_IDS": "2-4"}, "shards 0 to 3"),
        ({"SHARD_COUNT": "4", "SHARD_IDS": "one"}, "like 0-3 or 0,2,4"),
    ],
)
def test_shard_ids_that_cannot_work_are_refused_saying_why(
    monkeypatch: pytest.MonkeyPatch, env: dict, said: str
) -> None:
    with pytest.raises(ValidationError, match=said):
        settings(monkeypatch, **env)


def test_the_step_cache_is_off_unless_a_threshold_is_set_and_tune_sampler_applies_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker.pipeline.loading import load_pipeline, tune_sampler

    pipeline = load_pipeline("tiny", "cpu")

    def tuned(written: str) -> float:
        given = settings(monkeypatch, ANIMEGAMER_STEP_CACHE_BELOW=written).step_cache_below
        tune_sampler({"tiny": pipeline}, step_cache_below=given)
        return pipeline.config.sampler.step_cache_below

    assert [tuned(""), tuned("0.1"), tuned("0")] == [0.0, 0.1, 0.0]


def test_the_unconditional_half_is_skipped_where_w_is_within_a_thousandth_of_1_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert settings(monkeypatch).skip_unconditional_below == 0.001
    assert settings(monkeypatch, ANIMEGAMER_SKIP_UNCONDITIONAL_BELOW="0").skip_unconditional_below == 0.0


def test_a_broker_timeout_the_outbox_hold_cannot_outlast_ends_every_command_with_one_line_naming_both(tmp_path):
    """Before, the outbox was never sure its hold outlasted a send: nothing was ever sent, and nothing said so."""
    code, said = check_with(tmp_path, {"ANIMEGAMER_BROKER_TIMEOUT": "10"})
    assert code == 2 and len(said.splitlines()) == 1, said
    assert said.startswith("ANIMEGAMER_BROKER_TIMEOUT (10 s) must be") and "ANIMEGAMER_DUTY_SECONDS (10 s)" in said


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("discord_timeout", 6.0, "ANIMEGAMER_DISCORD_TIMEOUT (6 s)"),
        ("delivery_poll_seconds", 5.0, "ANIMEGAMER_DELIVERY_POLL_SECONDS (5 s)"),
        ("liveness_seconds", 5.0, "ANIMEGAMER_LIVENESS_SECONDS (5 s)"),
    ],
)
def test_settings_at_odds_with_the_duty_hold_are_named_together(field, value, named) -> None:
    said = settings_at_odds(Settings(**{field: value}))
    assert said is not None and said.startswith(named) and "ANIMEGAMER_DUTY_SECONDS (10 s)" in said


def test_a_stall_limit_the_time_limit_would_beat_is_named_with_it() -> None:
    said = settings_at_odds(Settings(worker_stall_seconds=600, task_time_limit=600))
    assert said is not None and said.startswith("ANIMEGAMER_WORKER_STALL_SECONDS (600 s)")
    assert "ANIMEGAMER_TASK_TIME_LIMIT (600 s)" in said


def test_a_default_threshold_over_the_cap_every_server_is_held_to_is_named_with_it() -> None:
    said = settings_at_odds(Settings(safety_threshold=0.95, safety_threshold_max=0.9))
    assert said is not None and said.startswith("ANIMEGAMER_SAFETY_THRESHOLD (0.95)")
    assert "ANIMEGAMER_SAFETY_THRESHOLD_MAX (0.9)" in said


def test_a_workers_stall_limit_is_half_a_short_time_limit_unless_set() -> None:
    assert Settings().worker_stall_seconds == 300
    assert Settings(task_time_limit=20).worker_stall_seconds == 10
    assert settings_at_odds(Settings(task_time_limit=20)) is None


def test_the_default_settings_work_together() -> None:
    assert settings_at_odds(Settings()) is None


def test_a_workers_claim_length_is_read_by_its_name_now_and_by_its_earlier_one(monkeypatch) -> None:
    """ANIMEGAMER_CLAIM_SECONDS was ANIMEGAMER_LEASE_SECONDS, a word the bot's holds on duties use: a deployment
    that still sets the old name keeps its value."""
    monkeypatch.setenv("ANIMEGAMER_LEASE_SECONDS", "12")
    assert Settings(_env_file=None).claim_seconds == 12
    monkeypatch.setenv("ANIMEGAMER_CLAIM_SECONDS", "9")
    assert Settings(_env_file=None).claim_seconds == 9


def test_password_settings_reach_every_client_as_typed() -> None:
    """Redis (redis-py, kombu) and the database (SQLAlchemy) each read back the password exactly as typed."""
    from kombu.utils.url import url_to_parts
    from redis.connection import parse_url
    from sqlalchemy.engine import make_url

    typed = "ab%41cd/+=#?@:% é["
    settings = Settings(
        broker_url="redis://redis:6379/0",
        result_backend="redis://redis:6379/1",
        database_url="postgresql+asyncpg://animegamer@postgres:5432/animegamer",
        redis_password=typed,
        database_password=typed,
    )
    assert parse_url(settings.broker_url)["password"] == parse_url(settings.result_backend)["password"] == typed
    assert url_to_parts(settings.broker_url).password == typed
    assert (
        make_url(settings.database_url).password == typed and make_url(settings.database_url).username == "animegamer"
    )
    assert typed not in repr(settings)


def test_a_redis_password_setting_leaves_the_embedded_queue_alone(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path, redis_password="secret")
    assert settings.broker_url.startswith("sqla+sqlite:///") and "secret" not in settings.broker_url
