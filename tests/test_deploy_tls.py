"""compose.tls.yaml over compose.yaml: TLS and a Redis user per role, read from the files as compose merges them, and
its pieces run here: the one-shot's own command makes the certificates and the ACL file, and a real redis-server 7
started with its Redis's own arguments takes the workers' user only for what a worker does. `docker compose config`
where a compose is installed; the Kubernetes twin (overlays/trial-tls) is checked in tests/test_kubernetes.py."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest
import redis
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry

from relay.redis_acl import BOT, HEALTH, WORKER, bot_rules, worker_rules
from relay.settings import Settings, variable_of
from tests import tiers
from tests.scrape import free_port
from tests.stack import compose_command
from tests.test_deploy import COMPOSE, NOT_FOR_WORKERS, OPERATORS_ENV, REPO, SETTINGS, interpolate, write_env

OVERLAY = yaml.safe_load((REPO / "compose.tls.yaml").read_text())
# Sequences compose appends to the base file's (the rest of a list, like command or a health check's test, replaces).
APPENDED = {"volumes", "ports"}


def merged(base: Any, overlay: Any, key: str = "") -> Any:
    """Compose's merge of an override file, for what these two files hold: mappings key by key, volumes and ports
    appended, any other value replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        both = {**base, **overlay}
        both.update((k, merged(base[k], overlay[k], k)) for k in base.keys() & overlay.keys())
        return both
    if isinstance(base, list) and isinstance(overlay, list) and key in APPENDED:
        return base + overlay
    return overlay


SERVICES = merged(COMPOSE, OVERLAY)["services"]
# Each Redis client, the user it signs in as, the .env variable of its password and the volume of its certificate.
CLIENTS = {
    "bot": (BOT, "REDIS_BOT_PASSWORD", "tls-bot"),
    "worker": (WORKER, "REDIS_WORKER_PASSWORD", "tls-worker"),
    "worker-cpu": (WORKER, "REDIS_WORKER_PASSWORD", "tls-worker"),
}
# The operator's .env for the overlay: passwords holding reserved characters (a %41 too), and compose.yaml's own.
PASSWORDS = {
    "REDIS_PASSWORD": "he4lth/Kp+w2=",
    "REDIS_BOT_PASSWORD": "b0t/+=Xy9@:%41",
    "REDIS_WORKER_PASSWORD": "w0rker/+=Qz#?",
}
ENV = {**OPERATORS_ENV, **PASSWORDS}


def mounts(service: str) -> dict[str, str]:
    """The service's mounts of named volumes: its folder inside, and the volume (with ":ro" when read-only)."""
    found = {}
    for mount in SERVICES[service].get("volumes", []):
        source, target, *mode = mount.split(":")
        if not source.startswith((".", "$")):  # not a folder of the host
            found[target] = source + "".join(f":{m}" for m in mode)
    return found


def settings_of(service: str, tls: Path | None = None) -> Settings:
    """The Redis settings the service's container starts with, its environment as compose hands it (.env being
    ``ENV``); with ``tls``, its certificates' folder moved there."""
    values = {name: interpolate(str(value), ENV) for name, value in SERVICES[service]["environment"].items()}
    if tls is not None:
        values = {name: value.replace("/tls/", f"{tls}/") for name, value in values.items()}
    fields = {
        field: values[variable]
        for field in ("broker_url", "result_backend", "redis_password", "redis_ca_file", "redis_cert_file",
                      "redis_key_file", "queue")
        if values.get(variable := variable_of(field))
    }  # fmt: skip
    return Settings(_env_file=None, **fields)


# -- read from the files ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", sorted(CLIENTS))
def test_every_redis_client_signs_in_as_its_own_user_over_tls_verified_against_the_ca(service: str) -> None:
    user, password, volume = CLIENTS[service]
    settings = settings_of(service)
    folder = {v: k for k, v in mounts(service).items()}[f"{volume}:ro"]
    for url in (settings.broker_url, settings.result_backend):
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, unquote(parts.username)) == ("rediss", "redis", user)
        assert unquote(parts.password) == PASSWORDS[password]
        query = dict(parse_qsl(parts.query))
        assert query == {
            "ssl_cert_reqs": "required",
            "ssl_ca_certs": f"{folder}/ca.pem",
            "ssl_certfile": f"{folder}/client.pem",
            "ssl_keyfile": f"{folder}/client.key",
        }
    assert SERVICES[service]["depends_on"]["certificates"] == {"condition": "service_completed_successfully"}


def test_a_worker_holds_the_workers_password_alone_and_no_key_but_its_own() -> None:
    for service in ("worker", "worker-cpu"):
        environment = SERVICES[service]["environment"]
        assert environment["ANIMEGAMER_REDIS_PASSWORD"] == "${REDIS_WORKER_PASSWORD:?set REDIS_WORKER_PASSWORD in .env}"
        assert not set(environment) & (NOT_FOR_WORKERS | {"REDIS_BOT_PASSWORD", "REDIS_PASSWORD"}), service
        assert not [v for v in environment.values() if "REDIS_BOT_PASSWORD" in str(v) or "{REDIS_PASSWORD" in str(v)]
        assert set(mounts(service).values()) == {"worker-data", "tls-worker:ro"}, "no other role's key"
    assert SERVICES["worker-cpu"]["profiles"] == ["cpu"], "still started only when named"
    worker, bot = (settings_of(name).redis_password.get_secret_value() for name in ("worker", "bot"))
    assert worker != bot


def test_each_key_is_in_a_volume_its_reader_alone_mounts_read_only() -> None:
    readers: dict[str, set[str]] = {}
    for name in SERVICES:
        for volume in mounts(name).values():
            if volume.startswith("tls-"):
                assert name == "certificates" or volume.endswith(":ro"), (name, volume)
                readers.setdefault(volume.removesuffix(":ro"), set()).add(name)
    assert readers == {
        "tls-ca": {"certificates"},  # the CA's key: nobody reads it but the one-shot that signs with it
        "tls-redis": {"certificates", "redis"},
        "tls-postgres": {"certificates", "postgres"},
        "tls-bot": {"certificates", "bot", "migrate"},
        "tls-worker": {"certificates", "worker", "worker-cpu"},
    }
    assert set(OVERLAY["volumes"]) == set(readers)


def test_redis_speaks_only_tls_asks_for_client_certificates_and_takes_only_the_acl_files_users() -> None:
    command = SERVICES["redis"]["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert command[0] == "redis-server"
    assert options["--port"] == "0", "no plain-text port"
    assert (options["--tls-port"], options["--tls-auth-clients"]) == ("6379", "yes")
    folder = {v: k for k, v in mounts("redis").items()}["tls-redis:ro"]
    assert options["--aclfile"] == f"{folder}/users.acl"
    for option, name in (
        ("--tls-cert-file", "server.pem"),
        ("--tls-key-file", "server.key"),
        ("--tls-ca-cert-file", "ca.pem"),
    ):
        assert options[option] == f"{folder}/{name}"
    assert (options["--appendonly"], options["--maxmemory-policy"]) == ("yes", "noeviction"), "as compose.yaml's"
    assert "requirepass" not in " ".join(command) and "PASSWORD" not in " ".join(command)
    health = SERVICES["redis"]["healthcheck"]
    assert health["test"][0] == "CMD-SHELL" and f"--tls --cacert {folder}/ca.pem" in health["test"][1]
    assert f"--user {HEALTH} ping" in health["test"][1] and health["interval"] == "5s"  # the rest is compose.yaml's
    assert SERVICES["redis"]["environment"]["REDISCLI_AUTH"] == "${REDIS_PASSWORD:?set REDIS_PASSWORD in .env}"


def test_the_one_shot_writes_the_acl_file_from_the_code_with_passwords_from_its_environment() -> None:
    certificates = SERVICES["certificates"]
    (script,) = certificates["command"]
    assert certificates["entrypoint"] == ["sh", "-euc"] and certificates["restart"] == "no"
    redis_folder = {v: k for k, v in mounts("certificates").items()}["tls-redis"]
    assert f"python -m relay.redis_acl > {redis_folder}/users.acl" in script
    assert "PASSWORD" not in script, "a password on a command line is in every process list"
    environment = certificates["environment"]
    for variable in ("REDIS_BOT_PASSWORD", "REDIS_WORKER_PASSWORD"):
        assert environment[variable] == f"${{{variable}:?set {variable} in .env}}"
    assert environment["REDIS_HEALTH_PASSWORD"] == "${REDIS_PASSWORD:?set REDIS_PASSWORD in .env}"
    assert "build" in certificates and certificates["image"] == SERVICES["bot"]["image"], "the bot's image: the code"


def test_postgresql_takes_tls_alone_and_the_bot_and_the_migration_verify_it() -> None:
    command = SERVICES["postgres"]["command"]
    options = dict(option.split("=", 1) for option in command[2::2])
    assert command[0] == "postgres" and set(command[1::2]) == {"-c"}
    folder = {v: k for k, v in mounts("postgres").items()}["tls-postgres:ro"]
    assert options == {
        "ssl": "on",
        "ssl_cert_file": f"{folder}/server.pem",
        "ssl_key_file": f"{folder}/server.key",
        "hba_file": f"{folder}/pg_hba.conf",
    }
    for service in ("bot", "migrate"):
        ca = SERVICES[service]["environment"]["ANIMEGAMER_DATABASE_CA_FILE"]
        assert f"{Path(ca).parent}" in mounts(service) and mounts(service)[str(Path(ca).parent)] == "tls-bot:ro"
        values = {k: interpolate(str(v), ENV) for k, v in SERVICES[service]["environment"].items()}
        settings = Settings(
            _env_file=None,
            database_url=values["ANIMEGAMER_DATABASE_URL"],
            database_password=values["ANIMEGAMER_DATABASE_PASSWORD"],
            database_ca_file=ca,
        )
        query = dict(parse_qsl(urlsplit(settings.database_url).query))
        assert query == {"sslmode": "verify-full", "sslrootcert": ca}


def test_every_variable_the_overlay_adds_to_compose_yamls_is_documented_in_the_env_example() -> None:
    documented = set(re.findall(r"^#? ?([A-Z_]+)=", (REPO / ".env.example").read_text(), re.MULTILINE))
    read = {name: set(re.findall(r"\$\{(\w+)", (REPO / file).read_text())) for name, file in (
        ("base", "compose.yaml"), ("overlay", "compose.tls.yaml"))}  # fmt: skip
    assert read["overlay"] - read["base"] - documented == set()
    assert {"REDIS_BOT_PASSWORD", "REDIS_WORKER_PASSWORD", "REDIS_HOSTNAMES", "REDIS_PUBLISH"} <= SETTINGS


def test_redis_is_published_on_this_host_alone_unless_asked() -> None:
    (port,) = SERVICES["redis"]["ports"]
    assert interpolate(port, {}) == "127.0.0.1:6379:6379"
    assert interpolate(port, {"REDIS_PUBLISH": "6379"}) == "6379:6379"


@pytest.fixture
def compose(tmp_path: Path) -> list[str]:
    command = compose_command()
    if command is None:
        pytest.skip("no docker compose on this machine: the files are checked above by reading them")
    files = ["-f", str(REPO / "compose.yaml"), "-f", str(REPO / "compose.tls.yaml")]
    return [*command, *files, "--env-file", str(tmp_path / "stack.env")]


def test_compose_accepts_the_overlay(compose: list[str], tmp_path: Path) -> None:
    write_env(tmp_path / "stack.env", ENV)
    done = subprocess.run([*compose, "config"], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "rediss://animegamer-worker@redis:6379/0" in done.stdout and "--tls-port" in done.stdout


@pytest.mark.parametrize("missing", ["REDIS_BOT_PASSWORD", "REDIS_WORKER_PASSWORD"])
def test_compose_refuses_the_overlay_without_a_users_password(compose: list[str], tmp_path: Path, missing: str) -> None:
    write_env(tmp_path / "stack.env", {k: v for k, v in ENV.items() if k != missing})
    done = subprocess.run([*compose, "config"], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert done.returncode != 0 and f"set {missing} in .env" in done.stderr


# -- run here ---------------------------------------------------------------------------------------------------------


def one_shot(out: Path) -> Path:
    """The certificates service's command as written, run here with its folders moved: /opt/tls (the repository's
    deploy/tls) to deploy/tls, and /tls, whose subfolders are its volumes, to ``out``. Handing the volumes to their
    readers' uids needs root, as in the container; elsewhere that step alone is left out."""
    certificates = SERVICES["certificates"]
    assert "./deploy/tls:/opt/tls:ro" in certificates["volumes"]
    for target in (mount.split(":")[1] for mount in certificates["volumes"] if not mount.startswith(".")):
        assert re.fullmatch(r"/tls/\w+", target), target  # each volume a folder of /tls
    (script,) = certificates["command"]
    script = script.replace("/opt/tls/", f"{REPO}/deploy/tls/")
    script = re.sub(r"(?<![\w./-])/tls(?=/|\s|$)", str(out), script)
    if os.geteuid() != 0:
        script = re.sub(r"&& chown -R \S+ [^&]+", "", script)
    env = {name: interpolate(str(value), ENV) for name, value in certificates["environment"].items()}
    done = subprocess.run(
        [*certificates["entrypoint"], script],
        env={**env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return out


def started_redis(folder: Path, data: Path, port: int) -> subprocess.Popen[bytes]:
    """The overlay's Redis command as written, on this machine's redis-server: its folders and port moved here."""
    command = [
        interpolate(str(arg), {"REDIS_MAXMEMORY": "64mb"}).replace("/tls/", f"{folder}/") for arg in
        SERVICES["redis"]["command"]
    ]  # fmt: skip
    command[command.index("--tls-port") + 1] = str(port)
    command[command.index("--dir") + 1] = str(data)
    # A group of its own, ended with the test whatever happens.
    return subprocess.Popen(
        [*command, "--bind", "127.0.0.1", "--logfile", str(data / "redis.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def on_this_machine(settings: Settings, port: int) -> Settings:
    """The same settings, the URLs' host ``redis`` (the stack's network) moved to localhost: a name the certificate
    also holds, so the host name is still checked."""
    urls = {name: getattr(settings, name).replace("@redis:6379/", f"@localhost:{port}/") for name in (
        "broker_url", "result_backend")}  # fmt: skip
    return settings.model_copy(update=urls)


def client(port: int, folder: Path, **options: Any) -> redis.Redis:
    """A client of the Redis on ``port`` with the CA and the client certificate in ``folder`` (a worker's, say), none
    of redis-py's retries (each would wait for a refusal again)."""
    tls = {"ssl_ca_certs": str(folder / "ca.pem"), "ssl_certfile": str(folder / "client.pem"),
           "ssl_keyfile": str(folder / "client.key")}  # fmt: skip
    return redis.Redis("localhost", port, ssl=True, retry=Retry(NoBackoff(), 0), socket_timeout=5, **{**tls, **options})


def test_the_one_shot_makes_a_certificate_for_each_reader_signed_by_its_ca_and_a_tls_only_pg_hba(
    tmp_path: Path,
) -> None:
    from cryptography import x509

    if shutil.which("openssl") is None:
        pytest.skip("no openssl on this machine: the one-shot makes the certificates with it")
    tls = one_shot(tmp_path / "tls")
    assert sorted(p.name for p in tls.iterdir()) == ["bot", "ca", "postgres", "redis", "worker"]
    files = {
        folder: sorted(p.name for p in (tls / folder).iterdir()) for folder in ("redis", "postgres", "bot", "worker")
    }
    assert files == {
        "redis": ["ca.pem", "server.key", "server.pem", "users.acl"],
        "postgres": ["ca.pem", "pg_hba.conf", "server.key", "server.pem"],
        "bot": ["ca.pem", "client.key", "client.pem"],
        "worker": ["ca.pem", "client.key", "client.pem"],
    }, "each reader's own, and no reader but the one-shot holds the CA's key"
    for folder, name in (("redis", "server"), ("postgres", "server"), ("bot", "client"), ("worker", "client")):
        verified = subprocess.run(
            ["openssl", "verify", "-CAfile", str(tls / "ca" / "ca.pem"), str(tls / folder / f"{name}.pem")],
            capture_output=True,
            text=True,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert (tls / folder / f"{name}.key").stat().st_mode & 0o077 == 0, "a key is its owner's alone"
    for folder, host in (("redis", "redis"), ("postgres", "postgres")):
        certificate = x509.load_pem_x509_certificate((tls / folder / "server.pem").read_bytes())
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert {host, "localhost"} <= set(names.get_values_for_type(x509.DNSName)), "compose's name for it"
    if os.geteuid() == 0:
        owners = {folder: {p.stat().st_uid for p in (tls / folder).iterdir()} for folder in files}
        assert owners == {"redis": {999}, "postgres": {999}, "bot": {10001}, "worker": {10001}}
    rules = [line.split() for line in (tls / "postgres" / "pg_hba.conf").read_text().splitlines() if line.strip()]
    assert {rule[0] for rule in rules} == {"local", "hostssl"}, "over the network, TLS alone"
    acl = (tls / "redis" / "users.acl").read_text()
    assert not [p for p in PASSWORDS.values() if p in acl], "the file holds each password's hash alone"
    assert acl.startswith("user default off ")
    assert f" {worker_rules('turns')}\n" in acl and f" {bot_rules('turns')}\n" in acl
    before = (tls / "ca" / "ca.pem").read_bytes()
    one_shot(tls)
    assert (tls / "ca" / "ca.pem").read_bytes() == before, "made once: a second `up` keeps every certificate"


@pytest.mark.slow
@pytest.mark.timeout(120)  # a Redis server and two Celery apps' connections take seconds
def test_a_real_redis_on_the_overlays_arguments_and_users_refuses_a_worker_what_it_does_not_need(
    tmp_path: Path,
) -> None:
    from relay.celery_app import check_broker, make_celery

    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.skip("needs redis-server and openssl")
    tls = one_shot(tmp_path / "tls")
    tiers.starting("a Redis server")
    port, data = free_port(), tmp_path / "data"
    data.mkdir()
    server = started_redis(tls / "redis", data, port)
    try:
        worker = on_this_machine(settings_of("worker", tls / "worker"), port)
        bot = on_this_machine(settings_of("bot", tls / "bot"), port)
        as_worker = redis.Redis.from_url(worker.broker_url, retry=Retry(NoBackoff(), 0), socket_timeout=5)
        for _ in range(100):
            assert server.poll() is None, (data / "redis.log").read_text()
            with contextlib.suppress(redis.ConnectionError):
                assert as_worker.ping()
                break
            time.sleep(0.05)
        # What a worker does it may do: Celery's and kombu's connections (the certificate verified, its name
        # checked), and its game's queue.
        check_broker(make_celery(worker), 5)
        as_worker.lpush("turns", "a turn")
        # What it does not need it may not.
        for command in (("FLUSHDB",), ("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "*"), ("LPUSH", "other", "x")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                as_worker.execute_command(*command)
        # The bot's user does what the bot does, and administers nothing either.
        check_broker(make_celery(bot), 5)
        as_bot = redis.Redis.from_url(bot.broker_url, retry=Retry(NoBackoff(), 0), socket_timeout=5)
        assert as_bot.llen("turns") == 1
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_bot.flushall()
        # No connection does anything before it signs in, none signs in as the default user, none is made without
        # a client certificate signed by the CA, and nothing listens for plain text.
        with pytest.raises(redis.AuthenticationError):
            client(port, tls / "worker").ping()
        with pytest.raises(redis.AuthenticationError):
            client(port, tls / "worker", username="default", password="anything").ping()
        with pytest.raises(redis.ConnectionError):
            client(port, tls / "worker", ssl_certfile=None, ssl_keyfile=None).ping()
        with pytest.raises(redis.ConnectionError):
            redis.Redis("127.0.0.1", port, retry=Retry(NoBackoff(), 0), socket_timeout=2).ping()
        # The health check as written, as the user that may only PING.
        health = SERVICES["redis"]["healthcheck"]["test"][1]
        health = health.replace("/tls/", f"{tls / 'redis'}/").replace("redis-cli ", f"redis-cli -p {port} ", 1)
        env = {"PATH": os.environ["PATH"], "REDISCLI_AUTH": PASSWORDS["REDIS_PASSWORD"]}
        assert subprocess.run(["sh", "-c", health], env=env, capture_output=True, timeout=30).returncode == 0
        as_health = client(port, tls / "worker", username=HEALTH, password=PASSWORDS["REDIS_PASSWORD"])
        assert as_health.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_health.get("turns")
        argv = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert not [p for p in PASSWORDS.values() if p.encode() in argv]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(180)  # initdb and a PostgreSQL start on a busy 2-core machine
def test_the_one_shots_postgresql_certificate_serves_a_real_postgresql_verified_by_name(tmp_path: Path) -> None:
    """PostgreSQL takes the certificate and its key as the one-shot made them, and the bot's CA verifies it (the
    certificate and the name: sslmode=verify-full): the database is migrated through it, and `animegamer check`
    says so."""
    from animegamer import checks
    from db.migrate import upgrade
    from tests.certificates import Certificates
    from tests.postgres_server import PostgresServer

    if shutil.which("openssl") is None:
        pytest.skip("no openssl on this machine: the one-shot makes the certificates with it")
    tls = one_shot(tmp_path / "tls")
    postgres, bot = tls / "postgres", tls / "bot"
    made = Certificates(postgres / "ca.pem", postgres / "server.pem", postgres / "server.key", bot / "client.pem",
                        bot / "client.key")  # fmt: skip
    server = PostgresServer(made)
    server.start()
    try:
        settings = Settings(
            _env_file=None, data_dir=tmp_path, database_url=server.url(), database_ca_file=bot / "ca.pem"
        )
        upgrade(settings.database_url)  # what the migrate service does, through the engine the bot makes
        checked = checks.database(settings)
        assert checked.status == "ok" and "(TLS, certificate verified)" in checked.detail, checked
    finally:
        server.stop()
