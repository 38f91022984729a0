"""What deploy/kubernetes promises an operator, read from what kustomize renders (`kubectl kustomize` of the base and
of each overlay): every manifest valid for the Kubernetes API, KEDA's resources valid for KEDA's own CRDs, and each
piece holding what compose.yaml gives it and no more. The compose twin of these checks is tests/test_deploy.py."""

from __future__ import annotations

import atexit
import base64
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import jsonschema
import pytest
import yaml

from relay.settings import Settings, variable_of
from tests.test_deploy import NOT_FOR_WORKERS

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (.[test])")

REPO = Path(__file__).resolve().parent.parent
KUBERNETES = REPO / "deploy" / "kubernetes"
# What an operator applies: the base and every overlay (a new overlay is checked without being named here).
APPLIED = ["base", *sorted(f"overlays/{p.parent.name}" for p in KUBERNETES.glob("overlays/*/kustomization.yaml"))]
# KEDA 2.20 supports Kubernetes 1.30 and newer: the manifests must hold for the oldest.
KUBERNETES_VERSION = "1.30"
KEDA_API = "keda.sh/v1alpha1"
TRIAL = "overlays/trial"
# The trial with TLS and a Redis user per role: its Secrets hold certificates the operator makes (never committed), so
# it is rendered from a copy of deploy/kubernetes with them made there, by the operator's own command.
TRIAL_TLS = "overlays/trial-tls"
MAKE_CERTIFICATES = REPO / "deploy" / "tls" / "make-certificates.sh"
PRODUCTION = ("base", "overlays/production")  # no store of its own: every URL names a managed service

Manifest = dict[str, Any]


@cache
def with_certificates() -> Path:
    """A copy of deploy/kubernetes with trial-tls's certificates made as its kustomization says (removed at exit)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl on this machine: trial-tls's certificates are made with it")
    copy = Path(tempfile.mkdtemp(prefix="agtest-kubernetes-")) / "kubernetes"
    atexit.register(shutil.rmtree, copy.parent, True)
    shutil.copytree(KUBERNETES, copy, ignore=shutil.ignore_patterns("certificates"))
    made = subprocess.run(
        ["sh", str(MAKE_CERTIFICATES), str(copy / TRIAL_TLS / "certificates")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    return copy


@cache
def rendered(kustomization: str) -> tuple[Manifest, ...]:
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl on this machine: the manifests are rendered with `kubectl kustomize`")
    root = with_certificates() if kustomization == TRIAL_TLS else KUBERNETES
    done = subprocess.run(
        ["kubectl", "kustomize", str(root / kustomization)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def find(docs: tuple[Manifest, ...], kind: str, name: str) -> Manifest | None:
    return next((d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name), None)


def workloads(docs: tuple[Manifest, ...], component: str | None = None) -> list[Manifest]:
    """The owners of pods: Deployments, StatefulSets and Jobs (of one app.kubernetes.io/component, when given)."""
    return [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job")
        and component in (None, d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component"))
    ]


def containers(docs: tuple[Manifest, ...], component: str) -> list[Manifest]:
    found = [c for w in workloads(docs, component) for c in w["spec"]["template"]["spec"]["containers"]]
    assert found, f"no {component} in the render"
    return found


def environment(docs: tuple[Manifest, ...], container: Manifest) -> dict[str, str | None]:
    """Every variable the container starts with: the keys of the ConfigMaps and Secrets it reads whole, then its own
    env (None where a Secret or a field gives the value)."""
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        for kind, ref in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if ref in source:
                whole = find(docs, kind, source[ref]["name"])
                assert whole is not None or kind == "Secret", f"{container['name']} reads a missing {source}"
                env.update((whole or {}).get("data", {}))
    for variable in container.get("env", []):
        env[variable["name"]] = variable.get("value")
    return env


def setting(docs: tuple[Manifest, ...], container: Manifest, variable: str, field: str) -> float:
    """The setting as the program reads it: an empty or absent value is the program's own default."""
    value = environment(docs, container).get(variable)
    return float(value) if value else float(Settings.model_fields[field].default)


def secret_refs(pod: Manifest) -> list[tuple[str, str]]:
    """(Secret, key) for every value a pod's containers take from a Secret one key at a time."""
    return [
        (ref["name"], ref["key"])
        for c in pod["containers"]
        for v in c.get("env", [])
        if (ref := v.get("valueFrom", {}).get("secretKeyRef"))
    ]


def secret_data(secret: Manifest) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret.get("data", {}).items()}


def example_keys(secret: str) -> set[str]:
    """The keys base/<secret>.secrets.example.env documents for the Secret an operator makes."""
    text = (KUBERNETES / "base" / f"{secret.removeprefix('animegamer-')}.secrets.example.env").read_text()
    return set(re.findall(r"^([A-Z_]+)=", text, re.MULTILINE))


def quantity(value: str | int) -> float:
    """A Kubernetes quantity (256Mi, 24Gi, 500m, 2) as a number of bytes or cores."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value)).groups()
    return float(number) * units.get(unit, 1)


def closed(schema: Manifest) -> Manifest:
    """The CRD's schema refusing fields it does not name, as the API server's strict field validation (kubectl's
    default) does; an object marked x-kubernetes-preserve-unknown-fields stays open."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {name: closed(field) for name, field in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = closed(schema[key])
    return schema


@cache
def keda_schemas() -> dict[str, Manifest]:
    schemas = {}
    for path in (KUBERNETES / "crds").glob("keda.sh_*.yaml"):
        crd = yaml.safe_load(path.read_text())
        (version,) = [v for v in crd["spec"]["versions"] if f"keda.sh/{v['name']}" == KEDA_API]
        schemas[crd["spec"]["names"]["kind"]] = closed(version["schema"]["openAPIV3Schema"])
    return schemas


@pytest.mark.parametrize("kustomization", APPLIED)
def test_every_manifest_validates_against_the_kubernetes_schemas(kustomization: str) -> None:
    failures = []
    for doc in rendered(kustomization):
        if doc["apiVersion"] == KEDA_API:
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as refused:
            path = ".".join(str(step) for step in refused.path)
            failures.append(f"{doc['kind']}/{doc['metadata']['name']} {path}: {refused.message}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kustomization", APPLIED)
def test_the_keda_resources_validate_against_kedas_crds(kustomization: str) -> None:
    keda = [doc for doc in rendered(kustomization) if doc["apiVersion"] == KEDA_API]
    assert sorted(doc["kind"] for doc in keda) == ["ScaledObject", "TriggerAuthentication"]
    for doc in keda:
        jsonschema.Draft202012Validator(keda_schemas()[doc["kind"]]).validate(doc)


def test_the_crd_check_refuses_a_field_keda_does_not_know() -> None:
    """The check above can fail: a misspelt field is refused, as the API server refuses it."""
    (scaled,) = [doc for doc in rendered("base") if doc["kind"] == "ScaledObject"]
    misspelt = {**scaled, "spec": {**scaled["spec"], "cooldownPerod": 60}}
    with pytest.raises(jsonschema.ValidationError, match="cooldownPerod"):
        jsonschema.Draft202012Validator(keda_schemas()["ScaledObject"]).validate(misspelt)


@pytest.mark.parametrize("kustomization", APPLIED)
def test_the_crds_kept_for_the_tests_are_never_applied(kustomization: str) -> None:
    assert not [doc for doc in rendered(kustomization) if doc["kind"] == "CustomResourceDefinition"]


@pytest.mark.parametrize("kustomization", APPLIED)
def test_a_worker_holds_no_secret_it_does_not_use(kustomization: str) -> None:
    docs = rendered(kustomization)
    for worker in workloads(docs, "worker"):
        pod = worker["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, "no Kubernetes API token on a GPU node"
        assert not [v for v in pod.get("volumes", []) if "projected" in v]
        for volume in [v for v in pod.get("volumes", []) if "secret" in v]:
            # Its own client certificate and the CA (components/tls), nothing else.
            name = volume["secret"]["secretName"]
            assert name.startswith("animegamer-worker-tls"), name
            if (secret := find(docs, "Secret", name)) is not None:
                assert set(secret_data(secret)) == {"ca.pem", "client.pem", "client.key"}
        for container in pod["containers"]:
            held = set(environment(docs, container))
            assert not held & (NOT_FOR_WORKERS | {"KEDA_POSTGRES_CONNECTION"}), container["name"]
            assert not [s for s in container.get("envFrom", []) if "secretRef" in s], "a whole Secret, unseen keys"
        assert {name for name, _ in secret_refs(pod)} == {"animegamer-worker"}
    if (secret := find(docs, "Secret", "animegamer-worker")) is not None:
        assert set(secret_data(secret)) == {"ANIMEGAMER_BROKER_URL", "ANIMEGAMER_RESULT_BACKEND"}


@pytest.mark.parametrize("kustomization", APPLIED)
def test_the_migration_runs_the_bots_image_with_the_database_url_alone(kustomization: str) -> None:
    docs = rendered(kustomization)
    (migrate,) = containers(docs, "migrate")
    assert migrate["args"] == ["db", "upgrade"]
    assert set(environment(docs, migrate)) == {"ANIMEGAMER_DATABASE_URL", "ANIMEGAMER_DATA_DIR"}
    assert {c["image"] for c in containers(docs, "bot")} == {migrate["image"]}
    (job,) = workloads(docs, "migrate")
    assert job["kind"] == "Job" and job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("kustomization", APPLIED)
def test_a_worker_scaled_in_or_evicted_has_time_to_finish_its_turn(kustomization: str) -> None:
    """SIGTERM is Celery's warm shutdown: the worker ends its turn, which may run for the task time limit."""
    docs = rendered(kustomization)
    for worker in workloads(docs, "worker"):
        pod = worker["spec"]["template"]["spec"]
        for container in pod["containers"]:
            limit = setting(docs, container, "ANIMEGAMER_TASK_TIME_LIMIT", "task_time_limit")
            assert pod["terminationGracePeriodSeconds"] > limit, "a scale-in would kill the turn in hand"


@pytest.mark.parametrize("kustomization", APPLIED)
def test_a_bot_has_time_to_stop_cleanly(kustomization: str) -> None:
    docs = rendered(kustomization)
    for bot in workloads(docs, "bot"):
        pod = bot["spec"]["template"]["spec"]
        for container in pod["containers"]:
            stop = setting(docs, container, "ANIMEGAMER_STOP_SECONDS", "stop_seconds")
            assert pod["terminationGracePeriodSeconds"] > stop


@pytest.mark.parametrize("kustomization", APPLIED)
@pytest.mark.parametrize(
    ("component", "port_setting", "liveness"),
    [("bot", "ANIMEGAMER_METRICS_PORT", "/livez"), ("worker", "ANIMEGAMER_WORKER_METRICS_PORT", "/livez")],
)
def test_the_bot_and_the_workers_are_probed_for_liveness_and_readiness_at_their_metrics_port(
    kustomization: str, component: str, port_setting: str, liveness: str
) -> None:
    """Liveness is /livez, which fails when the process is stuck (bot/liveness.py, worker/liveness.py)."""
    docs = rendered(kustomization)
    for workload in workloads(docs, component):
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        for container in workload["spec"]["template"]["spec"]["containers"]:
            env = environment(docs, container)
            (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"]
            assert env[port_setting] == str(port)
            assert env["ANIMEGAMER_METRICS_ADDRESS"] == "0.0.0.0", "on 127.0.0.1 the kubelet cannot probe it"
            assert container["livenessProbe"]["httpGet"] == {"path": liveness, "port": "metrics"}
            assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
            assert annotations["prometheus.io/scrape"] == "true"
            assert annotations["prometheus.io/port"] == str(port)


@pytest.mark.parametrize("kustomization", APPLIED)
def test_every_long_running_container_has_liveness_and_readiness_probes(kustomization: str) -> None:
    for workload in workloads(rendered(kustomization)):
        if workload["kind"] != "Job":
            for container in workload["spec"]["template"]["spec"]["containers"]:
                assert "livenessProbe" in container and "readinessProbe" in container, workload["metadata"]["name"]


@pytest.mark.parametrize("kustomization", APPLIED)
def test_each_worker_not_pinned_to_the_cpu_asks_for_exactly_one_gpu(kustomization: str) -> None:
    docs = rendered(kustomization)
    for container in containers(docs, "worker"):
        resources = container["resources"]
        if environment(docs, container).get("ANIMEGAMER_DEVICE") == "cpu":
            assert "nvidia.com/gpu" not in resources.get("limits", {}) | resources.get("requests", {})
        else:
            assert int(resources["limits"]["nvidia.com/gpu"]) == 1
            assert int(resources.get("requests", {}).get("nvidia.com/gpu", 1)) == 1


@pytest.mark.parametrize("kustomization", PRODUCTION)
def test_productions_workers_run_the_published_model_on_a_gpu(kustomization: str) -> None:
    docs = rendered(kustomization)
    for container in containers(docs, "worker"):
        env = environment(docs, container)
        assert env["ANIMEGAMER_MODEL"] == "animegamer" and env.get("ANIMEGAMER_DEVICE") != "cpu"
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == 1
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == env["ANIMEGAMER_CHECKPOINTS"]]
        assert mount["readOnly"] is True


@pytest.mark.parametrize("kustomization", APPLIED)
def test_the_scaled_object_scales_the_worker_deployment_and_reads_the_database_from_the_bots_secret(
    kustomization: str,
) -> None:
    docs = rendered(kustomization)
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    target = scaled["spec"]["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    worker = find(docs, "Deployment", target["name"])
    assert worker is not None and worker in workloads(docs, "worker")
    assert "replicas" not in worker["spec"], "an apply would reset the count KEDA chose"
    for trigger in scaled["spec"]["triggers"]:
        auth = find(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert auth is not None
        for ref in auth["spec"]["secretTargetRef"]:
            assert ref["name"] == "animegamer-bot", "never the workers' Secret: they must not hold the database"
            assert ref["key"] in example_keys(ref["name"])
            if (secret := find(docs, "Secret", ref["name"])) is not None:
                assert ref["key"] in secret_data(secret)


@pytest.mark.parametrize("kustomization", APPLIED)
def test_every_pod_runs_unprivileged_with_a_read_only_root_and_no_api_token(kustomization: str) -> None:
    for workload in workloads(rendered(kustomization)):
        pod = workload["spec"]["template"]["spec"]
        name = workload["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod["containers"]:
            context = {**pod["securityContext"], **container["securityContext"]}
            assert context["runAsNonRoot"] is True and context["runAsUser"] != 0, name
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"] and "add" not in context["capabilities"], name
            assert context["readOnlyRootFilesystem"] is True, name


@pytest.mark.parametrize("kustomization", APPLIED)
def test_every_container_requests_cpu_and_memory_and_has_a_memory_limit(kustomization: str) -> None:
    for workload in workloads(rendered(kustomization)):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), workload["metadata"]["name"]
            assert quantity(resources["limits"]["memory"]) >= quantity(resources["requests"]["memory"])


def test_the_requests_cover_the_peaks_docs_measurements_states() -> None:
    measured = (REPO / "docs" / "measurements.md").read_text()
    crowd = measured[measured.index("## A crowd at once") :]
    bot_peaks = [int(mb) for mb in re.findall(r"\| (\d+) MB \|", crowd)]
    worker_peak = re.search(r"\| load \(the real loader, bf16\) \| [\d.]+ \| ([\d.]+) \|", measured)
    assert bot_peaks and worker_peak, "docs/measurements.md no longer states the bot's or the worker's peak memory"
    docs = rendered("base")
    (bot,) = containers(docs, "bot")
    (worker,) = containers(docs, "worker")
    assert quantity(bot["resources"]["requests"]["memory"]) >= max(bot_peaks) * 2**20
    assert quantity(worker["resources"]["requests"]["memory"]) >= float(worker_peak[1]) * 2**30


@pytest.mark.parametrize("kustomization", APPLIED)
def test_a_drain_takes_one_bot_process_and_one_worker_at_a_time(kustomization: str) -> None:
    docs = rendered(kustomization)
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for component in ("bot", "worker"):
        for workload in workloads(docs, component):
            labels = workload["spec"]["template"]["metadata"]["labels"]
            (budget,) = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
            assert budget["spec"]["maxUnavailable"] == 1
            if component == "bot":
                assert workload["spec"]["replicas"] >= 2, "a drain or a rolling update would leave no bot"


@pytest.mark.parametrize("kustomization", PRODUCTION)
def test_production_holds_no_secret_and_reaches_no_store_of_its_own(kustomization: str) -> None:
    docs = rendered(kustomization)
    assert not [d for d in docs if d["kind"] == "Secret"], "Secrets are made by the operator, never committed"
    assert not [d for d in docs if d["kind"] == "Service"], "Redis, PostgreSQL and the store are reached by URL"


def test_production_names_a_registry_image_for_every_container() -> None:
    for workload in workloads(rendered("overlays/production")):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            assert "/" in container["image"] and ":" in container["image"], container["image"]


@pytest.mark.parametrize("kustomization", [TRIAL, TRIAL_TLS])
def test_the_trials_secrets_hold_only_made_up_values(kustomization: str) -> None:
    """Or, with TLS, the certificates and keys the operator made (files named as make-certificates.sh names them)."""
    for secret in [d for d in rendered(kustomization) if d["kind"] == "Secret"]:
        for key, value in secret_data(secret).items():
            if key.endswith((".pem", ".key", ".conf")):
                assert secret["metadata"]["name"].startswith(("animegamer-", "postgres", "redis")), key
                continue
            assert key.endswith("ACCESS_KEY_ID") or re.search(r"trial-only|placeholder", value), key


def test_the_trials_services_and_their_clients_share_each_password() -> None:
    docs = rendered(TRIAL)
    bot, worker, stores = (secret_data(find(docs, "Secret", f"animegamer-{n}")) for n in ("bot", "worker", "stores"))
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    for url in (bot["ANIMEGAMER_DATABASE_URL"], bot["KEDA_POSTGRES_CONNECTION"]):
        assert unquote(urlsplit(url).password) == stores["POSTGRES_PASSWORD"]
        assert urlsplit(url).hostname.split(".")[0] in services
    for secret in (bot, worker):
        for url in (secret["ANIMEGAMER_BROKER_URL"], secret["ANIMEGAMER_RESULT_BACKEND"]):
            assert unquote(urlsplit(url).password) == stores["REDIS_PASSWORD"]
            assert urlsplit(url).hostname in services
    assert worker["ANIMEGAMER_BROKER_URL"] == bot["ANIMEGAMER_BROKER_URL"]
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert bot[key] == stores[key]
    (container,) = containers(docs, "bot")
    assert urlsplit(environment(docs, container)["AWS_ENDPOINT_URL"]).hostname in services


@pytest.mark.parametrize("kustomization", APPLIED)
def test_every_secret_key_a_pod_reads_is_in_its_secrets_example_file(kustomization: str) -> None:
    docs = rendered(kustomization)
    for workload in workloads(docs, None):
        for secret, key in secret_refs(workload["spec"]["template"]["spec"]):
            if secret.startswith("animegamer-") and secret != "animegamer-stores":
                assert key in example_keys(secret), (workload["metadata"]["name"], secret, key)
    for name in ("animegamer-bot", "animegamer-worker"):
        if (secret := find(docs, "Secret", name)) is not None:
            assert set(secret_data(secret)) == example_keys(name), "the trial's keys are the examples'"


def tls_mounts(docs: tuple[Manifest, ...], pod: Manifest, container: Manifest) -> dict[str, dict[str, str]]:
    """Each folder the container mounts from a Secret, and that Secret's files."""
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    return {
        mount["mountPath"]: secret_data(find(docs, "Secret", volumes[mount["name"]]))
        for mount in container.get("volumeMounts", [])
        if mount["name"] in volumes
    }


def test_the_tls_trials_redis_speaks_only_tls_and_knows_only_the_games_users() -> None:
    from relay.redis_acl import HEALTH, PASSWORDS

    docs = rendered(TRIAL_TLS)
    redis = find(docs, "Deployment", "redis")["spec"]["template"]["spec"]
    (server,) = redis["containers"]
    command = " ".join(server["command"])
    for option in ("--port 0 ", "--tls-port 6379", "--tls-auth-clients yes", "--appendonly yes", "noeviction"):
        assert option in command, option
    assert "requirepass" not in command and "REDIS_PASSWORD" not in {v["name"] for v in server["env"]}
    assert {v["name"] for v in server["env"]} >= {"REDISCLI_AUTH"}  # the probes' user's password
    mounts = tls_mounts(docs, redis, server)
    assert set(mounts["/tls"]) == {"ca.pem", "server.pem", "server.key"}
    for option in (
        "--tls-cert-file /tls/server.pem",
        "--tls-key-file /tls/server.key",
        "--tls-ca-cert-file /tls/ca.pem",
    ):
        assert option in command, option
    # The ACL file: written at each start by the code that defines the users, from the stores' passwords.
    aclfile = Path(server["command"][server["command"].index("--aclfile") + 1])
    (users,) = redis["initContainers"]
    assert {c["image"] for c in containers(docs, "bot")} == {users["image"]}, "the code that defines the users"
    assert f"python -m relay.redis_acl > {aclfile}" in users["command"][-1]
    written = {m["name"] for m in users["volumeMounts"] if m["mountPath"] == str(aclfile.parent)}
    read = {m["name"] for m in server["volumeMounts"] if m["mountPath"] == str(aclfile.parent) and m["readOnly"]}
    (memory,) = [v for v in redis["volumes"] if v["name"] in read]
    assert written == read and memory["emptyDir"]["medium"] == "Memory", "the file is Redis's alone, never on a disk"
    given = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in users["env"] if "secretKeyRef" in v["valueFrom"]}
    assert set(given) == set(PASSWORDS.values())
    stores = secret_data(find(docs, "Secret", "animegamer-stores"))
    assert all(ref["name"] == "animegamer-stores" and ref["key"] in stores for ref in given.values())
    for probe in (server["livenessProbe"], server["readinessProbe"]):
        assert "redis-cli --tls --cacert /tls/ca.pem" in probe["exec"]["command"][-1]
        assert f"--user {HEALTH} ping" in probe["exec"]["command"][-1]


@pytest.mark.parametrize(("component", "user"), [("bot", "animegamer-bot"), ("worker", "animegamer-worker")])
def test_the_tls_trials_bot_and_workers_sign_in_as_their_own_users_and_verify_the_ca(component: str, user: str) -> None:
    """The URLs as the program reads them: rediss://, the role's own user and password, the certificate verified
    against the CA mounted from the role's own Secret, and the role's client certificate shown."""
    docs = rendered(TRIAL_TLS)
    stores = secret_data(find(docs, "Secret", "animegamer-stores"))
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    secret = secret_data(find(docs, "Secret", f"animegamer-{component}"))
    for workload in workloads(docs, component):
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            env = environment(docs, container)
            ((folder, files),) = tls_mounts(docs, pod, container).items()
            assert set(files) == {"ca.pem", "client.pem", "client.key"}
            tls = {field: env[variable_of(field)] for field in ("redis_ca_file", "redis_cert_file", "redis_key_file")}
            assert tls == {
                "redis_ca_file": f"{folder}/ca.pem",
                "redis_cert_file": f"{folder}/client.pem",
                "redis_key_file": f"{folder}/client.key",
            }
            settings = Settings(
                _env_file=None,
                broker_url=secret["ANIMEGAMER_BROKER_URL"],
                result_backend=secret["ANIMEGAMER_RESULT_BACKEND"],
                **tls,
            )
            for url in (settings.broker_url, settings.result_backend):
                parts = urlsplit(url)
                assert parts.scheme == "rediss" and parts.hostname in services
                assert unquote(parts.username) == user
                assert unquote(parts.password) == stores[f"REDIS_{component.upper()}_PASSWORD"]
                query = dict(parse_qsl(parts.query))
                assert query["ssl_cert_reqs"] == "required" and query["ssl_ca_certs"] == tls["redis_ca_file"]
    assert stores["REDIS_BOT_PASSWORD"] != stores["REDIS_WORKER_PASSWORD"]


def test_the_tls_trials_database_takes_only_tls_and_the_bot_and_the_migration_verify_it() -> None:
    docs = rendered(TRIAL_TLS)
    postgres = find(docs, "Deployment", "postgres")["spec"]["template"]["spec"]
    (server,) = postgres["containers"]
    args = " ".join(server["args"])
    assert "ssl=on" in args and "hba_file=/tls/pg_hba.conf" in args
    files = tls_mounts(docs, postgres, server)["/tls"]
    assert set(files) == {"server.pem", "server.key", "pg_hba.conf"}
    rules = [line.split() for line in files["pg_hba.conf"].splitlines() if line.strip() and not line.startswith("#")]
    assert {rule[0] for rule in rules} == {"local", "hostssl"}, "over the network, TLS alone"
    url = secret_data(find(docs, "Secret", "animegamer-bot"))["ANIMEGAMER_DATABASE_URL"]
    query = dict(parse_qsl(urlsplit(url).query))
    assert query["sslmode"] == "verify-full"
    for component in ("bot", "migrate"):
        for workload in workloads(docs, component):
            pod = workload["spec"]["template"]["spec"]
            for container in pod["containers"]:
                ca = Path(query["sslrootcert"])
                assert "ca.pem" in tls_mounts(docs, pod, container)[str(ca.parent)], component
    keda = secret_data(find(docs, "Secret", "animegamer-bot"))["KEDA_POSTGRES_CONNECTION"]
    assert dict(parse_qsl(urlsplit(keda).query))["sslmode"] == "require", "PostgreSQL refuses it in plain text now"


# Where a setting the program reads reaches no pod, and why (tests/test_deploy.py says the same for compose).
NOT_PASSED = {
    "ANIMEGAMER_CLIP_DIR": "clips live in the S3 store",
    "ANIMEGAMER_BLOB_DIR": "with the results in Redis, large results cross in Redis",
    "ANIMEGAMER_MIGRATE_AT_START": "the migration Job migrates",
    "SHARD_IDS": "each bot process connects every shard (overlays/shard-ranges sets it)",
    "ANIMEGAMER_DATABASE_PASSWORD": "optional: the Secret's URL holds the password (bot.secrets.example.env)",
    "ANIMEGAMER_REDIS_PASSWORD": "optional: the Secrets' URLs hold the password (bot.secrets.example.env)",
    "ANIMEGAMER_REDIS_CA_FILE": "the base's Redis is in the cluster; TLS is for workers elsewhere (docs/operating.md)",
    "ANIMEGAMER_REDIS_CERT_FILE": "the base's Redis is in the cluster; TLS is for workers elsewhere",
    "ANIMEGAMER_REDIS_KEY_FILE": "the base's Redis is in the cluster; TLS is for workers elsewhere",
    "ANIMEGAMER_DATABASE_CA_FILE": "the base's PostgreSQL is in the cluster; TLS is for a database elsewhere",
    "AWS_CA_BUNDLE": "the base's store is reached inside the cluster; TLS is for a store elsewhere",
}


def test_every_setting_the_program_reads_reaches_the_pod_that_reads_it_or_is_named_here_with_why() -> None:
    read = {variable_of(name) for name in Settings.model_fields}
    docs = rendered("base")
    given = {
        variable
        for component in ("bot", "worker", "migrate")
        for container in containers(docs, component)
        for variable in environment(docs, container)
    }
    assert read - given == set(NOT_PASSED)


def shards(ids: str) -> list[int]:
    """SHARD_IDS as the program reads it: numbers and ranges, 0-7 or 0,2,4."""
    found: list[int] = []
    for part in ids.split(","):
        first, _, last = part.partition("-")
        found += range(int(first), int(last or first) + 1)
    return found


def test_the_shard_ranges_connect_every_shard_exactly_once() -> None:
    docs = rendered("overlays/shard-ranges")
    bots = workloads(docs, "bot")
    assert len(bots) >= 2
    connected: list[int] = []
    for bot in bots:
        (container,) = bot["spec"]["template"]["spec"]["containers"]
        env = environment(docs, container)
        connected += shards(env["SHARD_IDS"])
        count = int(env["SHARD_COUNT"])
    assert sorted(connected) == list(range(count))
    selectors = [bot["spec"]["selector"]["matchLabels"].items() for bot in bots]
    for other in bots:
        labels = other["spec"]["template"]["metadata"]["labels"].items()
        assert sum(selector <= labels for selector in selectors) == 1, "each range's Deployment owns its pods alone"


@pytest.mark.parametrize("kustomization", (*PRODUCTION, TRIAL))
def test_by_default_every_bot_process_connects_every_shard(kustomization: str) -> None:
    docs = rendered(kustomization)
    for container in containers(docs, "bot"):
        assert not environment(docs, container).get("SHARD_IDS")
