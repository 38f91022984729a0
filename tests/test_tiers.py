"""The fast tier cannot hold a test that starts a worker or a server: such a test is slow by its fixtures, and
one that starts a process some other way fails in the fast tier instead of slowing it down. A test that hangs
fails alone at its time limit, and the run goes on."""

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


def specimens(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    """A folder of specimen tests inside the suite's tree (so the suite's conftest applies), removed by the caller."""
    folder = REPO / "tests" / f"_specimens_{tmp_path.name}"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for name, text in (files or {"conftest.py": CONFTEST, "test_specimens.py": SPECIMENS}).items():
        (folder / name).write_text(text)
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


HANGS = """
import asyncio
import threading

import pytest


@pytest.mark.timeout(2)
def test_waits_on_an_event_nobody_sets():
    threading.Event().wait()


@pytest.mark.timeout(2)
async def test_awaits_an_event_nobody_sets():
    await asyncio.Event().wait()


def test_after_the_hangs():
    pass
"""


def test_a_hung_test_fails_alone_at_its_time_limit_with_its_stack_and_the_run_goes_on(tmp_path: Path) -> None:
    folder = specimens(tmp_path, {"test_hangs.py": HANGS})
    try:
        run = fast_tier(folder)
    finally:
        shutil.rmtree(folder)
    assert run.returncode == 1, run.stdout[-3000:]
    assert "2 failed, 1 passed" in run.stdout, run.stdout[-3000:]
    assert run.stdout.count("Timeout (>2.0s)") >= 2, run.stdout[-3000:]
    assert "threading.Event().wait()" in run.stdout  # the hung line, in the stack printed for it
    assert "await asyncio.Event().wait()" in run.stdout  # an async test's: its task's stack, not the loop's poll
