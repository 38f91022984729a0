"""Nothing is open or shown that the operator did not choose: the endpoints listen on loopback unless set, and a
secret survives whatever characters it holds."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from sqlalchemy.engine import make_url

from relay.settings import Settings, encoded_secret


def test_the_metrics_endpoints_listen_on_loopback_unless_set(tmp_path, monkeypatch):
    monkeypatch.delenv("ANIMEGAMER_METRICS_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    assert ipaddress.ip_address(Settings().metrics_address).is_loopback


# A password as `openssl rand -base64 32` makes one about half the time, with an @ and a : for good measure.
PASSWORD = "Xy9Qz/Kp+w2=@a:b"


def test_a_password_with_reserved_characters_is_encoded_into_each_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no .env here
    monkeypatch.setenv("ANIMEGAMER_BROKER_URL", f"redis://:{PASSWORD}@cache:6379/0")
    monkeypatch.setenv("ANIMEGAMER_RESULT_BACKEND", f"redis://default:{PASSWORD}@cache:6379/1")
    monkeypatch.setenv("ANIMEGAMER_DATABASE_URL", f"postgresql+asyncpg://animegamer:{PASSWORD}@db/animegamer")
    settings = Settings()
    broker, results, database = (
        urlsplit(settings.broker_url),
        urlsplit(settings.result_backend),
        make_url(settings.database_url),
    )
    assert (broker.hostname, broker.port, unquote(broker.password)) == ("cache", 6379, PASSWORD)
    assert (results.username, unquote(results.password), results.path) == ("default", PASSWORD, "/1")
    assert (database.host, database.password, database.database) == ("db", PASSWORD, "animegamer")


def test_an_encoded_url_is_left_as_it_is():
    url = "redis://:Xy9Qz%2FKp%2Bw2%3D@cache:6379/0"
    assert encoded_secret(url) == url
    assert encoded_secret("sqla+sqlite:///data/broker.db") == "sqla+sqlite:///data/broker.db"


def check_with(folder: Path, settings: dict[str, str]) -> tuple[int, str]:
    """``animegamer check --worker`` in ``folder`` with only these ANIMEGAMER_* settings: its exit code and output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANIMEGAMER_")}
    done = subprocess.run(
        [sys.executable, "-m", "animegamer", "check", "--worker"],
        env={**env, **settings, "ANIMEGAMER_DATA_DIR": str(folder)},
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, (done.stdout + done.stderr).strip()


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("ANIMEGAMER_BROKER_URL", "redis://:s3cretPart@cache:notaport/0"),
        ("ANIMEGAMER_RESULT_BACKEND", "redis://:s3cretPart@cache:99999999/1"),
        ("ANIMEGAMER_DATABASE_URL", "postgresql+asyncpg://animegamer:s3cretPart@db:port/animegamer"),
    ],
)
def test_a_url_no_client_can_read_ends_the_command_with_one_line_naming_the_setting_never_the_url(
    tmp_path, variable, url
):
    code, said = check_with(tmp_path, {variable: url})
    assert code == 2 and len(said.splitlines()) == 1, said
    assert said.startswith(f"{variable} cannot be read as a URL") and "percent-encode" in said
    assert "s3cret" not in said and "cache" not in said and "Traceback" not in said
