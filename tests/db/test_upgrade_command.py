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


def test_db_upgrade_migrates_and_never_prints_the_databases_password(postgres: Postgres):
    if reason := postgres.unavailable():
        pytest.skip(reason)
    name = postgres.new_database()
    try:
        # The test server trusts local connections, so any password is accepted and must still stay unseen.
        url = make_url(postgres.url_for(name)).set(password="hunter2").render_as_string(hide_password=False)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ANIMEGAMER_")},
            "ANIMEGAMER_DATABASE_URL": url,
        }
        run = subprocess.run(
            [sys.executable, "-m", "animegamer", "db", "upgrade"], cwd=REPO, env=env, capture_output=True, text=True
        )
    finally:
        postgres.drop(name)
    assert run.returncode == 0, run.stderr
    assert "Database at head" in run.stdout and "***" in run.stdout
    assert "hunter2" not in run.stdout + run.stderr
