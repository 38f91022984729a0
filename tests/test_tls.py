"""TLS, verified, against real servers on certificates the tests make (tests/certificates.py): a redis-server that
speaks only TLS and asks every client for a certificate, a PostgreSQL of the test's own with ssl on, and SeaweedFS's
S3 over https. The right CA
plays a turn and migrates the database; a wrong CA, an expired certificate, a missing client certificate or no CA
at all are each refused in one line that says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from animegamer import checks
from db.migrate import upgrade
from relay.celery_app import BrokerUnavailable, check_broker, make_celery
from relay.settings import Settings
from tests import tiers
from tests.certificates import Certificates, make_certificates
from tests.postgres_server import PostgresServer
from tests.redis_server import RedisServer
from tests.s3_server import S3Server
from tests.workers import start_worker, worker_env

pytestmark = tiers.SLOW


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, certificates: Certificates) -> Iterator[RedisServer]:
    started = RedisServer(tmp_path_factory.mktemp("tls-redis"), tls=certificates, client_certificates=True)
    started.start()
    yield started
    started.stop()


def tls_env(certificates: Certificates, ca: Path | None = None) -> dict[str, str]:
    return {
        "ANIMEGAMER_REDIS_CA_FILE": str(ca or certificates.ca),
        "ANIMEGAMER_REDIS_CERT_FILE": str(certificates.client_cert),
        "ANIMEGAMER_REDIS_KEY_FILE": str(certificates.client_key),
    }


def settings_on(server: RedisServer, tmp_path: Path, *, results_too: bool = True, **tls: object) -> Settings:
    """Both URLs on the TLS server, or only the broker (the results in SQLite: kombu's connection alone)."""
    results = {"result_backend": server.url(1)} if results_too else {}
    return Settings(data_dir=tmp_path, broker_url=server.url(0), **results, **tls)  # type: ignore[arg-type]


def with_client_certificate(certificates: Certificates, ca: Path | None) -> dict[str, object]:
    return {"redis_ca_file": ca, "redis_cert_file": certificates.client_cert, "redis_key_file": certificates.client_key}


def refusal(settings: Settings) -> str:
    with pytest.raises(BrokerUnavailable) as refused:
        check_broker(make_celery(settings), settings.broker_timeout)
    return str(refused.value)


def test_with_the_servers_ca_the_queue_and_blob_store_answer_and_check_says_verified(
    server: RedisServer, certificates: Certificates, tmp_path: Path
) -> None:
    settings = settings_on(server, tmp_path, **with_client_certificate(certificates, certificates.ca))
    queue, blobs = checks.queue(settings), checks.blob_store(settings)
    assert (queue.status, blobs.status) == ("ok", "ok"), (queue, blobs)
    assert queue.detail.count("(TLS, certificate verified)") == 2  # the broker and the results


def test_a_bare_rediss_url_is_verified_against_the_systems_cas_and_refused(
    certificates: Certificates, tmp_path: Path
) -> None:
    """Kombu alone connects to a ``rediss://`` broker whose URL says nothing more without checking its certificate
    ("defaulting to insecure SSL behaviour"): here, one no system CA signed."""
    open_to_all = RedisServer(tmp_path / "redis", tls=certificates)  # asks no client for a certificate
    open_to_all.start()
    try:
        said = refusal(Settings(data_dir=tmp_path, broker_url=open_to_all.url(0)))
    finally:
        open_to_all.stop()
    assert "its certificate did not verify" in said and "does not answer" not in said


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line_naming_the_queue(
    server: RedisServer, certificates: Certificates, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other-ca")
    settings = settings_on(server, tmp_path, results_too=False, **with_client_certificate(certificates, other.ca))
    said = refusal(settings)
    assert said.startswith(f"The queue at rediss://127.0.0.1:{server.port}/0")
    assert "its certificate did not verify" in said and "ANIMEGAMER_REDIS_CA_FILE" in said
    checked = checks.queue(settings)
    assert checked.status == "fail" and checked.detail == (
        f"rediss://127.0.0.1:{server.port}/0 was refused: its certificate did not verify "
        "(self-signed certificate in certificate chain)"
    )


def test_an_expired_certificate_is_refused_saying_so(tmp_path: Path) -> None:
    expired = make_certificates(tmp_path / "ca", expired=True)
    stale = RedisServer(tmp_path / "redis", tls=expired)
    stale.start()
    try:
        said = refusal(settings_on(stale, tmp_path, redis_ca_file=expired.ca))
    finally:
        stale.stop()
    assert "its certificate did not verify (certificate has expired)" in said


def test_a_client_without_a_certificate_is_refused_where_the_server_asks_for_one(
    server: RedisServer, certificates: Certificates, tmp_path: Path
) -> None:
    said = refusal(settings_on(server, tmp_path, results_too=False, redis_ca_file=certificates.ca))
    assert "was refused: the TLS handshake failed" in said and "ANIMEGAMER_REDIS_CERT_FILE" in said


def test_a_worker_plays_a_turn_through_tls_with_a_client_certificate(
    server: RedisServer, certificates: Certificates, tmp_path: Path
) -> None:
    env = worker_env(tmp_path / "worker", server.url(0), **tls_env(certificates))
    env["ANIMEGAMER_RESULT_BACKEND"] = server.url(1)
    worker = start_worker(env)
    try:
        result = worker.send_turn("Character: Qiqi; Motion: gently wave; Background: day town.").get(timeout=120)
    finally:
        worker.kill()
    assert result["num_frames"] == 17 and result["label"] == "tiny model, random weights"


# -- PostgreSQL ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def postgres(certificates: Certificates) -> Iterator[PostgresServer]:
    started = PostgresServer(certificates)
    started.start()
    yield started
    started.stop()


def test_the_database_over_tls_with_its_ca_is_migrated_and_check_says_verified(
    postgres: PostgresServer, certificates: Certificates, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, database_url=postgres.url(), database_ca_file=certificates.ca)
    upgrade(settings.database_url)  # alembic, through the same engine the bot makes
    checked = checks.database(settings)
    assert checked.status == "ok", checked
    assert f"127.0.0.1:{postgres.port}/postgres (TLS, certificate verified) at revision" in checked.detail


def test_a_database_certificate_another_ca_signed_is_refused_saying_so(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other-ca")
    checked = checks.database(Settings(data_dir=tmp_path, database_url=postgres.url(), database_ca_file=other.ca))
    assert checked.status == "fail"
    assert "was refused: its certificate did not verify (unable to get local issuer certificate)" in (checked.detail)
    assert "ANIMEGAMER_DATABASE_CA_FILE" in checked.fix


# -- the S3 store ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, certificates: Certificates) -> Iterator[S3Server]:
    started = S3Server(tmp_path_factory.mktemp("seaweedfs"), tls=certificates)
    started.start()
    yield started
    started.stop()


def test_clips_in_a_store_over_https_with_its_ca_are_written_and_check_says_verified(
    store: S3Server, certificates: Certificates, tmp_path: Path
) -> None:
    settings = store.settings(Settings(data_dir=tmp_path)).model_copy(update={"aws_ca_bundle": certificates.ca})
    checked = checks.clip_store(settings)
    assert checked.status == "ok", checked
    assert f"at {store.endpoint} (TLS, certificate verified): written, read back and deleted" in checked.detail


def test_a_store_certificate_another_ca_signed_is_refused_saying_so(store: S3Server, tmp_path: Path) -> None:
    other = make_certificates(tmp_path / "other-ca")
    settings = store.settings(Settings(data_dir=tmp_path)).model_copy(update={"aws_ca_bundle": other.ca})
    checked = checks.clip_store(settings)
    assert checked.status == "fail" and "was refused: its certificate did not verify" in checked.detail, checked
    assert "AWS_CA_BUNDLE" in checked.fix
