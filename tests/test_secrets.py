"""Nothing is open or shown that the operator did not choose: the endpoints listen on loopback unless set, and a
secret survives whatever characters it holds."""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote, urlsplit

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
