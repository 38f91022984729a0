"""`animegamer db upgrade` against a real PostgreSQL whose URL carries a password: migrated, the password unprinted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

from tests.db.conftest import Postgres
from tests.workers import REPO

pytestmark = pytest.mark.slow  # a PostgreSQL server


def db_upgrade(url: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANIMEGAMER_")}, "ANIMEGAMER_DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "animegamer", "db", "upgrade"], cwd=REPO, env=env, capture_output=True, text=True
    )


def test_db_upgrade_migrates_and_never_prints_the_databases_password(postgres: Postgres):
    if reason := postgres.unavailable():
        pytest.skip(reason)
    name = postgres.new_database()
    try:
        # The test server trusts local connections, so any password is accepted and must still stay unseen.
        url = make_url(postgres.url_for(name)).set(password="hunter2").render_as_string(hide_password=False)
        run = db_upgrade(url)
    finally:
        postgres.drop(name)
    assert run.returncode == 0, run.stderr
    assert "Database at head" in run.stdout and "***" in run.stdout
    assert "hunter2" not in run.stdout + run.stderr


def test_db_upgrade_of_a_database_that_does_not_exist_says_so_in_one_line_and_how_to_make_it(postgres: Postgres):
    if reason := postgres.unavailable():
        pytest.skip(reason)
    url = make_url(postgres.url_for("no_such_game")).set(password="hunter2").render_as_string(hide_password=False)
    run = db_upgrade(url)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    (said,) = run.stderr.strip().splitlines()
    assert said.startswith('The database "no_such_game" does not exist on') and "CREATE DATABASE no_such_game" in said
    assert "hunter2" not in run.stdout + run.stderr


def test_db_upgrade_as_a_role_that_does_not_exist_says_the_login_was_refused_not_that_the_database_is_missing(
    postgres: Postgres,
):
    if reason := postgres.unavailable():
        pytest.skip(reason)
    url = make_url(postgres.url_for("postgres")).set(username="no_such_role", password="hunter2")
    run = db_upgrade(url.render_as_string(hide_password=False))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    (said,) = run.stderr.strip().splitlines()
    assert "refused the login" in said and 'role "no_such_role" does not exist' in said
    assert "CREATE DATABASE" not in said and "hunter2" not in run.stdout + run.stderr
