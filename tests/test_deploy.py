"""What compose.yaml and the Dockerfile promise an operator, read from the files themselves; `docker compose config`
where a compose is installed. The stack run from outside is `make stack` (tests/stack.py)."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
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


def test_redis_keeps_what_it_is_given_and_never_evicts() -> None:
    command = " ".join(SERVICES["redis"]["command"])
    assert "--appendonly yes" in command and "--maxmemory-policy noeviction" in command


def test_the_gpu_worker_reserves_an_nvidia_gpu_and_the_cpu_one_only_runs_when_named() -> None:
    (device,) = SERVICES["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "deploy" not in SERVICES["worker-cpu"] and SERVICES["worker-cpu"]["profiles"] == ["cpu"]


def test_the_bot_starts_after_its_stores_are_healthy_and_the_database_is_migrated() -> None:
    assert SERVICES["bot"]["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    assert SERVICES["migrate"]["command"] == ["db", "upgrade"] and SERVICES["migrate"]["restart"] == "no"
    assert SERVICES["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}


@pytest.mark.parametrize(
    ("service", "port_setting"), [("bot", "ANIMEGAMER_METRICS_PORT"), ("worker", "ANIMEGAMER_WORKER_METRICS_PORT")]
)
def test_the_bot_and_the_worker_are_healthy_when_their_readyz_says_so(service: str, port_setting: str) -> None:
    test = SERVICES[service]["healthcheck"]["test"]
    port = SERVICES[service]["environment"][port_setting]
    assert test == ["CMD", "python", "-m", "relay.probes", f"http://127.0.0.1:{port}/readyz"]


def test_every_long_running_service_has_a_health_check_and_restarts() -> None:
    for name, service in SERVICES.items():
        if name != "migrate":
            assert service["healthcheck"]["test"][0] == "CMD", name
            assert service["restart"] == "unless-stopped", name


def test_checkpoints_are_mounted_read_only_and_what_must_survive_is_a_volume() -> None:
    (checkpoints,) = [v for v in SERVICES["worker"]["volumes"] if v.endswith(":/checkpoints:ro")]
    assert checkpoints.startswith("${ANIMEGAMER_CHECKPOINTS_DIR:-./checkpoints}")
    named = {v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", []) if v != checkpoints}
    assert named == {"redis-data", "postgres-data", "bot-data", "worker-data"} == set(COMPOSE["volumes"])


def test_secrets_come_from_the_env_file_and_are_never_written_in_the_compose_file() -> None:
    for name in ("bot", "worker", "migrate"):
        assert SERVICES[name]["env_file"] == "${ANIMEGAMER_ENV_FILE:-.env}"
        assert "DISCORD_TOKEN" not in SERVICES[name]["environment"]
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")


def test_every_setting_compose_gives_is_a_setting_the_program_reads() -> None:
    for name, service in SERVICES.items():
        if name not in ("redis", "postgres"):
            assert set(service["environment"]) <= SETTINGS, (name, set(service["environment"]) - SETTINGS)


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
    (tmp_path / "stack.env").write_text("DISCORD_TOKEN=x\n")
    return [*command, "-f", str(REPO / "compose.yaml")]


def test_compose_accepts_the_file_with_its_gpu_reservation(compose: list[str], tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "ANIMEGAMER_ENV_FILE": str(tmp_path / "stack.env")}
    done = subprocess.run([*compose, "config"], env={**env, "POSTGRES_PASSWORD": "pw"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "driver: nvidia" in done.stdout


def test_compose_refuses_to_start_without_a_database_password_and_says_so(compose: list[str], tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "ANIMEGAMER_ENV_FILE": str(tmp_path / "stack.env")}
    done = subprocess.run([*compose, "config"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "set POSTGRES_PASSWORD in .env" in done.stderr


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
    from relay.settings import Settings

    for name, field in Settings.model_fields.items():
        variable = field.validation_alias or field.alias or f"ANIMEGAMER_{name.upper()}"
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
