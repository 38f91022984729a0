"""The game's database room: models, engine and session setup, and the queries the app needs.

``db.migrate`` (Alembic) is imported on its own, by the CLI and tests, so the bot's import of
``db`` does not pull in Alembic.
"""

from __future__ import annotations

from db.base import Base
from db.engine import DEFAULT_URL, DatabaseFileError, make_engine, make_sessionmaker

__all__ = ["DEFAULT_URL", "Base", "DatabaseFileError", "make_engine", "make_sessionmaker"]
