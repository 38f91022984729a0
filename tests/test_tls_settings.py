"""What the TLS settings make of the URLs, and what `animegamer check` says of a connection, with no server at all
(tests/test_tls.py tries them against a real one)."""

from __future__ import annotations

import ssl
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from animegamer.checks import _in_the_clear
from relay.settings import Settings, settings_at_odds
from relay.tls import postgres_transport, public_host, redis_transport


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def test_a_rediss_url_asks_for_a_verified_certificate_against_the_ca_given(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        broker_url="rediss://redis.example.net:6379/0",
        result_backend="rediss://redis.example.net:6379/1",
        redis_ca_file=Path("/etc/tls/ca.pem"),
        redis_cert_file=Path("/etc/tls/worker.pem"),
        redis_key_file=Path("/etc/tls/worker.key"),
    )
    for url in (settings.broker_url, settings.result_backend):
        assert query(url) == {
            "ssl_cert_reqs": ["required"],
            "ssl_ca_certs": ["/etc/tls/ca.pem"],
            "ssl_certfile": ["/etc/tls/worker.pem"],
            "ssl_keyfile": ["/etc/tls/worker.key"],
        }


def test_a_value_written_in_the_url_wins_and_a_plain_url_is_left_alone(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        broker_url="rediss://redis.example.net:6379/0?ssl_cert_reqs=none",
        result_backend="redis://127.0.0.1:6379/1",
    )
    assert query(settings.broker_url) == {"ssl_cert_reqs": ["none"]}
    assert settings.result_backend == "redis://127.0.0.1:6379/1"
    assert redis_transport(settings.broker_url).said() == "TLS, certificate NOT verified"


def test_a_password_as_typed_and_tls_go_together(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        broker_url="rediss://redis.example.net/0",
        redis_password="ab%41cd/+=#?@:",  # type: ignore[arg-type]
    )
    parts = urlsplit(settings.broker_url)
    assert unquote(parts.password or "") == "ab%41cd/+=#?@:" and parts.hostname == "redis.example.net"
    assert redis_transport(settings.broker_url).said() == "TLS, certificate verified"


def test_a_ca_file_beside_a_plain_text_broker_is_at_odds(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, broker_url="redis://10.0.0.5:6379/0", redis_ca_file=Path("/ca.pem"))
    said = settings_at_odds(settings)
    assert said is not None and "ANIMEGAMER_REDIS_CA_FILE" in said and "plain text" in said


@pytest.mark.parametrize(
    ("url", "public"),
    [
        ("redis://203.0.113.9:6379/0", False),  # documentation range: not global
        ("redis://8.8.8.8:6379/0", True),
        ("redis://redis.example.net:6379/0", True),
        ("redis://redis:6379/0", False),  # compose's service name
        ("redis://redis.animegamer.svc:6379/0", False),
        ("redis://10.1.2.3:6379/0", False),
        ("redis://127.0.0.1:6379/0", False),
        ("redis://localhost:6379/0", False),
    ],
)
def test_a_public_address_is_told_from_a_private_one(url: str, public: bool) -> None:
    assert public_host(url) is public


def test_plain_text_to_a_public_address_is_a_warning_and_to_a_private_one_is_not() -> None:
    warned = _in_the_clear("queue", "ok", "redis://redis.example.net:6379/0")
    assert warned.status == "warn" and "plain text to a public address" in warned.detail
    assert _in_the_clear("queue", "ok", "redis://10.0.0.5:6379/0").status == "ok"
    assert _in_the_clear("queue", "ok", "rediss://redis.example.net:6379/0").status == "ok"


@pytest.mark.parametrize(
    ("query_string", "said"),
    [
        ("", "plain text"),
        ("?ssl=require", "TLS, certificate NOT verified"),
        ("?sslmode=verify-full", "TLS, certificate verified"),
    ],
)
def test_a_databases_sslmode_says_how_it_travels(query_string: str, said: str) -> None:
    assert postgres_transport(f"postgresql+asyncpg://db.example.net/game{query_string}").said() == said


def test_a_database_ca_asks_for_verify_full_unless_the_url_names_a_mode(tmp_path: Path) -> None:
    plain = Settings(
        data_dir=tmp_path,
        database_url="postgresql+asyncpg://game@db.example.net/game",
        database_ca_file=Path("/ca.pem"),
    )
    assert query(plain.database_url) == {"sslmode": ["verify-full"], "sslrootcert": ["/ca.pem"]}
    chosen = Settings(
        data_dir=tmp_path,
        database_url="postgresql+asyncpg://game@db.example.net/game?sslmode=verify-ca",
        database_ca_file=Path("/ca.pem"),
    )
    assert query(chosen.database_url)["sslmode"] == ["verify-ca"]


def test_the_engine_turns_libpqs_tls_words_into_asyncpgs_ssl(tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    from db.engine import postgres_tls
    from tests.certificates import make_certificates

    ca = make_certificates(tmp_path).ca
    url, tls = postgres_tls(
        make_url(f"postgresql+asyncpg://game@db.example.net/game?sslmode=verify-full&sslrootcert={ca}")
    )
    assert isinstance(tls, ssl.SSLContext) and tls.check_hostname and tls.verify_mode is ssl.CERT_REQUIRED
    assert url.query == {}  # asyncpg takes no sslrootcert
    assert postgres_tls(make_url("postgresql+asyncpg://game@db/game?sslmode=require"))[1] == "require"
    assert postgres_tls(make_url("postgresql+asyncpg://game@db/game"))[1] is None
