"""What compose.yaml and the Dockerfile promise an operator, read from the files themselves; `docker compose config`
where a compose is installed. The stack run from outside is `make stack` (tests/stack.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
import yaml

from relay.probes import probe, with_health
from tests.scrape import free_port
from tests.stack import compose_command

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()
SETTINGS = set(re.findall(r"^([A-Z_]+)=", (REPO / ".env.example").read_text(), re.MULTILINE))


def stage(name: str) -> str:
    """One stage of the Dockerfile, from its FROM to the next."""
    return re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", DOCKERFILE, re.MULTILINE | re.DOTALL)[1]


def test_redis_keeps_what_it_is_given_never_evicts_and_has_a_memory_limit_and_a_password() -> None:
    command = " ".join(SERVICES["redis"]["command"])
    for option in (
        "--appendonly yes",
        "--maxmemory-policy noeviction",
        '--maxmemory "$$REDIS_MAXMEMORY"',
        "requirepass",
    ):
        assert option in command, option
    assert SERVICES["redis"]["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert "${" not in command, "the password would be in every process list"


@pytest.mark.slow
def test_the_stacks_redis_command_demands_its_password_whatever_it_holds_and_shows_it_in_no_argv(
    tmp_path: Path,
) -> None:
    """compose.yaml's own Redis command, run with this machine's redis-server (the local image's Debian one)."""
    import contextlib
    import secrets
    import shutil
    import time

    import redis

    from tests import tiers

    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server on this machine")
    tiers.starting("Redis as the stack starts it")
    (tmp_path / "docker-entrypoint.sh").write_text('#!/bin/sh\nexec "$@"\n')
    (tmp_path / "docker-entrypoint.sh").chmod(0o755)
    mark = secrets.token_hex(8)  # this test's alone, to look for in every process's argv
    password, port = f'{mark}/Kp+w2=#a?b@c"d\\e', free_port()
    _, flag, script = [part.replace("$$", "$") for part in SERVICES["redis"]["command"]]
    script = script.replace("--dir /data", f"--dir {tmp_path}") + f" --port {port} --bind 127.0.0.1 --appendonly no"
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "REDIS_PASSWORD": password, "REDIS_MAXMEMORY": "64mb"}
    # A group of its own: the script's pipeline runs redis-server as sh's child, which killing sh alone leaves running.
    server = subprocess.Popen(
        ["sh", flag, script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        client = redis.Redis("127.0.0.1", port, password=password, socket_timeout=2)
        for _ in range(100):
            assert server.poll() is None, "Redis did not start"
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        assert client.config_get("maxmemory") == {"maxmemory": str(64 * 2**20)}
        with pytest.raises(redis.AuthenticationError):
            redis.Redis("127.0.0.1", port, password="wrong", socket_timeout=2).ping()
        for argv in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                assert mark.encode() not in argv.read_bytes(), argv
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


def test_the_gpu_worker_reserves_an_nvidia_gpu_and_the_cpu_one_only_runs_when_named() -> None:
    (device,) = SERVICES["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "deploy" not in SERVICES["worker-cpu"] and SERVICES["worker-cpu"]["profiles"] == ["cpu"]


def test_the_bot_starts_after_its_stores_are_healthy_and_the_database_is_migrated() -> None:
    assert SERVICES["bot"]["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
        "seaweedfs": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    assert SERVICES["migrate"]["command"] == ["db", "upgrade"] and SERVICES["migrate"]["restart"] == "no"
    assert SERVICES["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}


@pytest.mark.parametrize(
    ("service", "port_setting", "paths"),
    [
        ("bot", "ANIMEGAMER_METRICS_PORT", ["/livez", "/readyz"]),
        ("worker", "ANIMEGAMER_WORKER_METRICS_PORT", ["/livez", "/readyz"]),
    ],
)
def test_the_bot_and_the_worker_are_healthy_when_their_probes_say_so(
    service: str, port_setting: str, paths: list[str]
) -> None:
    """Each is healthy while it works (/livez: not stuck) and is ready (/readyz)."""
    test = SERVICES[service]["healthcheck"]["test"]
    port = SERVICES[service]["environment"][port_setting]
    assert test == ["CMD", "python", "-m", "relay.probes", *(f"http://127.0.0.1:{port}{path}" for path in paths)]


def test_every_long_running_service_has_a_health_check_and_restarts() -> None:
    for name, service in SERVICES.items():
        if name != "migrate" and "monitoring" not in service.get("profiles", ()):
            assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
            assert service["restart"] == "unless-stopped", name


def test_checkpoints_are_mounted_read_only_and_what_must_survive_is_a_volume_of_one_service() -> None:
    (checkpoints,) = [v for v in SERVICES["worker"]["volumes"] if v.endswith(":/checkpoints:ro")]
    assert checkpoints.startswith("${ANIMEGAMER_CHECKPOINTS_DIR:-./checkpoints}")
    mounts = [v for s in SERVICES.values() for v in s.get("volumes", []) if v != checkpoints]
    named = {v.split(":")[0] for v in mounts if not v.startswith("./")}  # not the monitoring's files, read-only
    monitoring = {"prometheus-data", "grafana-data"}
    assert named - monitoring == {"redis-data", "postgres-data", "store-data", "worker-data"}
    assert named | monitoring == set(COMPOSE["volumes"])
    assert "volumes" not in SERVICES["bot"], "two bot processes share no disk: clips live in the store"


def test_two_bot_processes_keep_clips_in_the_stacks_s3_store() -> None:
    bot = SERVICES["bot"]
    assert bot["scale"] == 2
    assert bot["environment"]["ANIMEGAMER_CLIP_STORE"] == "${ANIMEGAMER_CLIP_STORE:-s3://animegamer/clips}"
    assert bot["environment"]["AWS_ENDPOINT_URL"] == "${AWS_ENDPOINT_URL:-http://seaweedfs:8333}"
    assert "-bucket=animegamer" in SERVICES["seaweedfs"]["command"]
    assert bot["depends_on"]["seaweedfs"] == {"condition": "service_healthy"}


# What no container of a worker may hold: it runs on rented machines and uses none of them.
NOT_FOR_WORKERS = {
    "DISCORD_TOKEN",
    "ANIMEGAMER_DATABASE_URL",
    "ANIMEGAMER_DATABASE_PASSWORD",
    "POSTGRES_PASSWORD",
    "AWS_SECRET_ACCESS_KEY",
}


def test_no_service_reads_the_whole_env_file_and_a_worker_holds_no_secret_it_does_not_use() -> None:
    for name, service in SERVICES.items():
        assert "env_file" not in service, name
    for name in ("worker", "worker-cpu"):
        assert not set(SERVICES[name]["environment"]) & NOT_FOR_WORKERS, name
    assert set(SERVICES["migrate"]["environment"]) == {
        "ANIMEGAMER_DATABASE_URL",
        "ANIMEGAMER_DATABASE_PASSWORD",
        "ANIMEGAMER_DATA_DIR",
    }


def test_secrets_come_from_the_env_file_and_are_never_written_in_the_compose_file() -> None:
    required = {
        ("bot", "DISCORD_TOKEN"),
        ("bot", "AWS_SECRET_ACCESS_KEY"),
        ("seaweedfs", "AWS_SECRET_ACCESS_KEY"),
        ("postgres", "POSTGRES_PASSWORD"),
        ("redis", "REDIS_PASSWORD"),
    }
    for service, variable in required:
        assert SERVICES[service]["environment"][variable] == f"${{{variable}:?set {variable} in .env}}", service


# Where a setting of .env.example reaches no container, and why.
NOT_PASSED = {
    "ANIMEGAMER_CLIP_DIR": "clips live in the stack's store",
    "ANIMEGAMER_BLOB_DIR": "with the results in Redis, large results cross in Redis",
    "ANIMEGAMER_MIGRATE_AT_START": "the migrate service migrates",
    "SHARD_IDS": "each bot process connects every shard",
    "ANIMEGAMER_CHECKPOINTS_DIR": "compose's own: the host folder mounted",
    "POSTGRES_PASSWORD": "compose's own: passed as ANIMEGAMER_DATABASE_PASSWORD",
    "REDIS_PASSWORD": "compose's own: passed as ANIMEGAMER_REDIS_PASSWORD",
    "REDIS_MAXMEMORY": "compose's own: Redis's limit",
    "REDIS_BOT_PASSWORD": "compose.tls.yaml's: the bot's Redis user's (tests/test_deploy_tls.py)",
    "REDIS_WORKER_PASSWORD": "compose.tls.yaml's: the workers' Redis user's (tests/test_deploy_tls.py)",
    "REDIS_HOSTNAMES": "compose.tls.yaml's: the names in Redis's certificate",
    "REDIS_PUBLISH": "compose.tls.yaml's: where Redis's TLS port is published",
    "GRAFANA_ADMIN_PASSWORD": "compose's own: Grafana's (the monitoring profile)",
    "ANIMEGAMER_REDIS_CA_FILE": "the stack's Redis is on the stack's own network; compose.tls.yaml sets it",
    "ANIMEGAMER_REDIS_CERT_FILE": "the stack's Redis is on the stack's own network; compose.tls.yaml sets it",
    "ANIMEGAMER_REDIS_KEY_FILE": "the stack's Redis is on the stack's own network; compose.tls.yaml sets it",
    "ANIMEGAMER_DATABASE_CA_FILE": "the stack's PostgreSQL is on its own network; compose.tls.yaml sets it",
    "AWS_CA_BUNDLE": "the stack's SeaweedFS is on its own network; TLS is for a store elsewhere",
}


def test_the_monitoring_profile_is_optional_and_loads_the_repositorys_alerts_and_dashboard() -> None:
    prometheus, grafana = SERVICES["prometheus"], SERVICES["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]  # a plain `up` starts neither
    assert "./deploy/monitoring/alerts.yml:/etc/prometheus/alerts.yml:ro" in prometheus["volumes"]
    assert "./deploy/monitoring/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    for service in (prometheus, grafana):  # on this machine only
        assert all(port.startswith("127.0.0.1:") for port in service["ports"])
    for mount in prometheus["volumes"] + grafana["volumes"]:
        if mount.startswith("./"):
            assert (REPO / mount.split(":")[0]).exists(), mount
    scraped = yaml.safe_load((REPO / "deploy/monitoring/prometheus.yml").read_text())["scrape_configs"]
    ports = {config["job_name"]: config["dns_sd_configs"][0]["port"] for config in scraped}
    bot, worker = SERVICES["bot"]["environment"], SERVICES["worker"]["environment"]
    assert ports == {
        "animegamer-bot": int(bot["ANIMEGAMER_METRICS_PORT"]),
        "animegamer-worker": int(worker["ANIMEGAMER_WORKER_METRICS_PORT"]),
    }
    assert bot["ANIMEGAMER_METRICS_ADDRESS"] == worker["ANIMEGAMER_METRICS_ADDRESS"] == "0.0.0.0"


def test_every_documented_setting_reaches_the_service_that_reads_it_or_is_named_here_with_why() -> None:
    given = {v for name in ("bot", "worker", "worker-cpu", "migrate") for v in SERVICES[name]["environment"]}
    assert SETTINGS - given == set(NOT_PASSED)


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation of one value: ${VAR}, ${VAR:-default}, ${VAR:?error} and $$."""

    def one(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        name, operator, default = match[1], match[2], match[3] or ""
        if env.get(name):
            return env[name]
        assert operator != ":?", default
        return default

    return re.sub(r"\$\$|\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


@pytest.mark.parametrize("service", ["bot", "worker", "migrate"])
def test_passwords_holding_any_reserved_character_reach_each_service_whole(
    service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.engine import make_url

    from relay.settings import Settings

    passwords = {name: f"Xy9Qz/Kp+w2=#a?b@%41 {name}" for name in ("POSTGRES_PASSWORD", "REDIS_PASSWORD")}
    env = {**passwords, "DISCORD_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s"}
    for variable in SETTINGS:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in SERVICES[service]["environment"].items():
        monkeypatch.setenv(variable, interpolate(str(value), env))
    monkeypatch.chdir(tmp_path)  # no .env here
    settings = Settings()
    assert make_url(settings.database_url).password == passwords["POSTGRES_PASSWORD"] or service == "worker"
    if service != "migrate":
        for url in (settings.broker_url, settings.result_backend):
            assert unquote(urlsplit(url).password) == passwords["REDIS_PASSWORD"]
            assert urlsplit(url).hostname == "redis"


def test_the_bot_image_installs_no_model_library_and_the_worker_image_installs_torch_first() -> None:
    assert re.search(r'pip install "/src\[bot,postgres\]"', stage("bot-build"))
    worker = stage("worker-build")
    assert worker.index("${TORCH_SPEC}") < worker.index('"/src[worker,postgres]"')


@pytest.mark.parametrize("image", ["bot", "worker"])
def test_each_image_runs_as_an_unprivileged_user_with_no_secret_baked_in(image: str) -> None:
    assert "USER animegamer" in stage(image)
    assert not re.search(r"^(ENV|ARG).*(TOKEN|PASSWORD)", DOCKERFILE, re.MULTILINE)


def test_the_images_bases_are_build_arguments() -> None:
    assert re.search(r"^ARG BASE=python:3\.11-slim$", DOCKERFILE, re.MULTILINE)
    assert re.search(r"^ARG WORKER_BASE=nvidia/cuda:\S+$", DOCKERFILE, re.MULTILINE)
    assert "FROM ${BASE} AS bot\n" in DOCKERFILE and "FROM ${WORKER_BASE} AS worker\n" in DOCKERFILE


@pytest.fixture
def compose(tmp_path: Path) -> list[str]:
    command = compose_command()
    if command is None:
        pytest.skip("no docker compose on this machine: the file is checked above by reading it")
    return [*command, "-f", str(REPO / "compose.yaml"), "--env-file", str(tmp_path / "stack.env")]


OPERATORS_ENV = {"DISCORD_TOKEN": "x", "POSTGRES_PASSWORD": "p", "REDIS_PASSWORD": "r", "AWS_SECRET_ACCESS_KEY": "s"}


def write_env(path: Path, env: dict[str, str]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in env.items()))


def test_compose_accepts_the_file_with_its_gpu_reservation(compose: list[str], tmp_path: Path) -> None:
    write_env(tmp_path / "stack.env", OPERATORS_ENV)
    done = subprocess.run([*compose, "config"], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "driver: nvidia" in done.stdout


@pytest.mark.parametrize("missing", sorted(OPERATORS_ENV))
def test_compose_refuses_to_start_without_a_secret_and_names_it(
    compose: list[str], tmp_path: Path, missing: str
) -> None:
    write_env(tmp_path / "stack.env", {k: v for k, v in OPERATORS_ENV.items() if k != missing})
    done = subprocess.run([*compose, "config"], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert done.returncode != 0 and f"set {missing} in .env" in done.stderr


@pytest.fixture
def endpoint() -> Iterator[tuple[int, list[bool]]]:
    """/readyz served as a process serves it, its answer the test's to change."""
    ready = [True]

    def metrics(environ, start_response):
        start_response("200 OK", [])
        return [b""]

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    port = free_port()
    server = make_server(
        "127.0.0.1", port, with_health(metrics, lambda: (ready[0], {"ready": ready[0]})), handler_class=Quiet
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield port, ready
    server.shutdown()
    server.server_close()


def test_the_health_probe_passes_on_ready_and_fails_on_not_ready_or_no_answer(endpoint, capsys) -> None:
    port, ready = endpoint
    assert probe(f"http://127.0.0.1:{port}/readyz") == 0
    ready[0] = False
    assert probe(f"http://127.0.0.1:{port}/readyz") == 1
    assert "503" in capsys.readouterr().out
    assert probe(f"http://127.0.0.1:{free_port()}/readyz", timeout=2) == 1


def test_every_setting_the_program_reads_is_documented_in_the_env_example() -> None:
    from relay.settings import Settings, variable_of

    for name in Settings.model_fields:
        variable = variable_of(name)
        assert variable in SETTINGS, f"{variable} is read by the program but missing from .env.example"


def test_a_copied_env_example_loads_as_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first thing an operator does (cp .env.example .env): its empty values mean "unset", as a file or as the
    environment compose hands a container."""
    from relay.settings import Settings

    for variable in SETTINGS:
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / ".env").write_text((REPO / ".env.example").read_text())
    monkeypatch.chdir(tmp_path)
    from_file = Settings()
    for line in (REPO / ".env.example").read_text().splitlines():
        if re.match(r"^[A-Z_]+=", line):
            monkeypatch.setenv(*line.split("=", 1))
    from_environment = Settings(_env_file=None)
    assert from_file == from_environment
    assert (from_file.shard_count, from_file.dev_guild, from_file.discord_token) == (None, None, None)
