"""The fast tier cannot hold a test that starts a worker or a server: such a test is slow by its fixtures, and
one that starts a process some other way fails in the fast tier instead of slowing it down."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.workers import REPO

SPECIMENS = """
import pytest

from tests.workers import start_worker, worker_env


@pytest.fixture(scope="module")
def module_worker(tmp_path_factory):
    start_worker(worker_env(tmp_path_factory.mktemp("worker")))


def test_asks_for_the_worker(sqlite_worker):
    pass


def test_asks_for_a_fixture_that_asks_for_the_worker(bot_settings_with_worker):
    pass


def test_needs_nothing():
    pass


def test_starts_a_worker_behind_the_fixtures_backs(tmp_path):
    start_worker(worker_env(tmp_path))


def test_uses_a_module_fixture_that_starts_a_worker(module_worker):
    pass
"""

CONFTEST = """
import pytest


@pytest.fixture
def bot_settings_with_worker(worker_settings):
    return worker_settings


@pytest.fixture
def worker_settings(sqlite_worker):
    return sqlite_worker
"""


def fast_tier(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest as ``make check`` runs it, on the specimen tests in ``folder`` (inside the suite's own tree)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not slow", "-q", *args, str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def specimens(tmp_path: Path) -> Path:
    folder = REPO / "tests" / f"_specimens_{tmp_path.name}"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "test_specimens.py").write_text(SPECIMENS)
    return folder


def test_tests_that_use_a_worker_fixture_are_left_out_of_the_fast_tier(tmp_path: Path) -> None:
    folder = specimens(tmp_path)
    try:
        run = fast_tier(folder, "--collect-only")
    finally:
        shutil.rmtree(folder)
    collected = [line.split("::")[-1] for line in run.stdout.splitlines() if "::" in line]
    assert sorted(collected) == [
        "test_needs_nothing",
        "test_starts_a_worker_behind_the_fixtures_backs",
        "test_uses_a_module_fixture_that_starts_a_worker",
    ], run.stdout


def test_a_fast_tier_test_that_starts_a_worker_fails_and_says_how_to_mark_it(tmp_path: Path) -> None:
    folder = specimens(tmp_path)
    try:
        run = fast_tier(folder, "-k", "worker and not asks_for")
    finally:
        shutil.rmtree(folder)
    assert run.returncode == 1, run.stdout[-2000:]
    said = "starts a worker process, which the fast tier (make check) never does"
    # The message shows in each test's report and, width allowing, again in the short summary: count names once.
    named = {line.split("::")[-1].split()[0] for line in run.stdout.splitlines() if said in line and "::" in line}
    assert named == {
        "test_uses_a_module_fixture_that_starts_a_worker",  # in its module fixture's setup
        "test_starts_a_worker_behind_the_fixtures_backs",
    }, run.stdout[-3000:]
