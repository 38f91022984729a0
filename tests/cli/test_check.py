"""`animegamer check`: each check passes on a working configuration and fails, saying what to do, on a broken one
(a wrong port, a database a revision behind, no worker, a folder that cannot be written), never printing a secret."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from animegamer.checks import Result, run_checks
from animegamer.cli import main
from db.migrate import head_revision, upgrade
from relay.settings import Settings, get_settings
from tests.redis_server import RedisServer
from tests.workers import Worker, settings_for

# Shaped like a bot token (the bot's id, base64; a timestamp; an HMAC), and no one's.
TOKEN = base64.b64encode(b"1174109841002594305").decode().rstrip("=") + ".GdE3kQ.not-a-real-secret-at-all-000"


def by_name(results: list[Result]) -> dict[str, Result]:
    return {result.name: result for result in results}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The embedded default in a folder of its own, its database migrated, a token set: only workers are missing."""
    made = Settings(data_dir=tmp_path, discord_token=SecretStr(TOKEN), queue="check-test", model="tiny")
    upgrade(made.database_url)
    return made


def test_the_embedded_default_with_no_worker_fails_only_on_workers_and_says_what_to_start(settings: Settings) -> None:
    results = by_name(run_checks(settings))
    assert {name for name, r in results.items() if r.status != "ok"} == {"workers"}
    assert "no worker answers for queue check-test" in results["workers"].detail
    assert "animegamer worker" in results["workers"].fix


def test_a_database_a_revision_behind_fails_naming_both_revisions(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    upgrade(settings.database_url, "0006")
    result = by_name(run_checks(settings))["database"]
    assert result.status == "fail" and f"at revision 0006, the code needs {head_revision()}" in result.detail
    assert "animegamer db upgrade" in result.fix


def test_a_missing_database_fails_and_is_not_created(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite+aiosqlite:///{tmp_path}/none.db")
    assert by_name(run_checks(settings))["database"].status == "fail"
    assert not (tmp_path / "none.db").exists()


def test_a_broker_on_a_wrong_port_fails_with_its_url(settings: Settings) -> None:
    wrong = settings.model_copy(update={"broker_url": "redis://127.0.0.1:9/0", "broker_timeout": 1.0})
    result = by_name(run_checks(wrong, "worker"))["queue"]
    assert result.status == "fail" and "redis://127.0.0.1:9/0" in result.detail


def test_a_blob_folder_that_cannot_be_written_fails(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    blocked = settings.model_copy(update={"blob_dir": tmp_path / "a-file" / "blobs"})
    result = by_name(run_checks(blocked, "worker"))["blob store"]
    assert result.status == "fail" and "a-file/blobs" in result.detail


@pytest.mark.parametrize("token", [None, "", "my-client-secret", "a.b"])
def test_a_missing_or_misshapen_token_fails_and_is_never_printed(settings: Settings, token: str | None) -> None:
    broken = settings.model_copy(update={"discord_token": None if token is None else SecretStr(token)})
    result = by_name(run_checks(broken))["discord token"]
    assert result.status == "fail"
    assert not token or token not in result.detail + result.fix


def test_a_worker_machine_is_not_asked_for_a_database_a_token_or_workers(tmp_path: Path) -> None:
    names = {result.name for result in run_checks(Settings(data_dir=tmp_path), "worker")}
    assert names == {"queue", "blob store", "disk", "nudity detector"}


def test_a_worker_machine_is_told_its_nudity_detector_loads(tmp_path: Path) -> None:
    result = by_name(run_checks(Settings(data_dir=tmp_path), "worker"))["nudity detector"]
    assert result.status == "ok" and "nudenet" in result.detail and "checked a frame" in result.detail


def test_a_worker_without_the_detector_fails_the_check_and_says_clips_are_withheld(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "nudenet", None)  # as on a machine where it was never installed
    result = by_name(run_checks(Settings(data_dir=tmp_path), "worker"))["nudity detector"]
    assert result.status == "fail" and "nudenet is missing" in result.detail
    assert "every clip is withheld" in result.fix


def test_the_command_prints_json_exits_1_on_a_failure_and_never_the_token(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in {"DATA_DIR": settings.data_dir, "QUEUE": "check-test", "MODEL": "tiny"}.items():
        monkeypatch.setenv(f"ANIMEGAMER_{key}", str(value))
    monkeypatch.setenv("DISCORD_TOKEN", TOKEN)
    get_settings.cache_clear()
    try:
        assert main(["check", "--json"]) == 1  # no worker
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr().out
    assert {item["name"]: item["status"] for item in json.loads(out)}["workers"] == "fail"
    assert TOKEN not in out


@pytest.mark.slow
def test_the_embedded_default_with_its_worker_passes_every_check(sqlite_worker: Worker, tmp_path: Path) -> None:
    settings = settings_for(sqlite_worker.env).model_copy(
        update={"discord_token": SecretStr(TOKEN), "database_url": f"sqlite+aiosqlite:///{tmp_path}/game.db"}
    )
    upgrade(settings.database_url)
    assert [(r.name, r.status) for r in run_checks(settings) if r.status != "ok"] == []


@pytest.mark.slow
def test_workers_of_another_model_fail_naming_it(sqlite_worker: Worker, tmp_path: Path) -> None:
    settings = settings_for(sqlite_worker.env).model_copy(update={"model": "toy"})  # the worker runs tiny
    result = by_name(run_checks(settings, "bot"))["workers"]
    assert result.status == "fail" and "(tiny)" in result.detail and "ANIMEGAMER_MODEL=toy" in result.fix


@pytest.mark.slow
def test_a_redis_that_forgets_on_restart_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")  # no appendonly, no snapshots
    server.start()
    try:
        settings = Settings(data_dir=tmp_path, broker_url=server.url(0), result_backend=server.url(1))
        results = run_checks(settings, "worker")
    finally:
        server.stop()
    redis = [r for r in results if r.name.startswith("redis")]
    assert [r.status for r in redis] == ["warn"] and "no persistence" in redis[0].detail
    assert [r.name for r in results if r.status == "fail"] == []


@pytest.mark.slow
def test_a_redis_password_with_reserved_characters_works_as_typed_and_is_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The password an operator got from `openssl rand -base64 32`, put into the URLs as it is."""
    server = RedisServer(tmp_path / "redis", password="Xy9Qz/Kp+w2=@a:b")
    server.start()
    try:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("ANIMEGAMER_DATA_DIR", str(tmp_path))
        monkeypatch.setenv("ANIMEGAMER_BROKER_URL", server.url(0))  # redis://:Xy9Qz/Kp+w2=@a:b@127.0.0.1:port/0
        monkeypatch.setenv("ANIMEGAMER_RESULT_BACKEND", server.url(1))
        get_settings.cache_clear()
        main(["check", "--worker", "--json"])
    finally:
        get_settings.cache_clear()
        server.stop()
    out = capsys.readouterr()
    statuses = {item["name"]: item["status"] for item in json.loads(out.out)}
    assert statuses["queue"] == statuses["blob store"] == "ok"  # connected, written and read back with it
    assert "Xy9Qz" not in out.out + out.err
