"""The alert rules and the dashboard an on-call person gets (deploy/monitoring/), checked offline: `promtool` loads
the rules and runs their unit tests, each alert names a section of the runbook, and every query of the dashboard
and the rules names a metric this project's code declares. That each is really exported is checked against a live
scrape of a bot and a worker (tests/bot/test_dashboard_metrics.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "deploy" / "monitoring"
ALERTS = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]
DASHBOARD = json.loads((MONITORING / "grafana" / "dashboards" / "animegamer.json").read_text())
# A metric as a query names it: a histogram's series carry _bucket/_sum/_count, a counter's _total.
METRIC = re.compile(r"\b(animegamer_[a-z_]+|process_[a-z_]+)\b")
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (apt-get install prometheus brings it; .ci/run installs it)")
    return found


def queries() -> list[str]:
    """Every PromQL expression of the dashboard and of the alert rules."""
    panels = [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]
    return panels + [rule["expr"] for rule in ALERTS]


def named_metrics(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_promtool_loads_the_alert_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(MONITORING / "alerts.yml")], capture_output=True)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_each_alert_fires_on_what_should_page_and_not_on_its_near_misses() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", "alerts.test.yml"], cwd=MONITORING, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_promtool_accepts_the_monitoring_profiles_prometheus_config(tmp_path: Path) -> None:
    """As compose mounts it: the config at /etc/prometheus/prometheus.yml beside the rules, here in a folder."""
    config = (MONITORING / "prometheus.yml").read_text().replace("/etc/prometheus/alerts.yml", "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(config)
    (tmp_path / "alerts.yml").write_text((MONITORING / "alerts.yml").read_text())
    done = subprocess.run([promtool(), "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert f"{len(ALERTS)} rules found".encode() in done.stdout + done.stderr


def test_every_alert_named_in_the_issue_exists_and_names_its_runbook_section() -> None:
    names = {rule["alert"] for rule in ALERTS}
    assert names == {
        "AnimeGamerTurnWaitingTooLong",
        "AnimeGamerTurnsFailing",
        "AnimeGamerNoWorkerForQueuedTurns",
        "AnimeGamerShardDisconnected",
        "AnimeGamerRedisMemoryNearLimit",
        "AnimeGamerClipStoreFailing",
        "AnimeGamerClipsWithheldUnchecked",
        "AnimeGamerForgedResults",
    }
    runbook = (REPO / "docs" / "runbook.md").read_text()
    sections = {
        re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-") for title in re.findall(r"^## (.+)$", runbook, re.M)
    }
    for rule in ALERTS:
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert page == "docs/runbook.md" and anchor in sections, rule["alert"]
        assert rule["labels"]["severity"] == "page"


def test_every_dashboard_panel_queries_a_metric_and_uses_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    for panel in DASHBOARD["panels"]:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"] and all(named_metrics(t["expr"]) for t in panel["targets"]), panel["title"]


def test_every_metric_the_queries_name_is_declared_by_the_bot_or_a_worker() -> None:
    """A cheap guard for the inner loop; the live scrape is the proof."""
    code = "".join(path.read_text() for folder in ("bot", "worker") for path in (REPO / folder).rglob("*.py"))
    declared = set(re.findall(r'"(animegamer_[a-z_]+)"', code))
    for expr in queries():
        for name in named_metrics(expr):
            if name.startswith("animegamer_"):
                assert base_name(name) in declared, (name, expr)
