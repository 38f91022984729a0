"""A game id, kept in app_state: every key in the clip store starts with it

Job and story ids start at 1 in every game's database, so two games sharing a bucket (the compose and Kubernetes
default, s3://animegamer/clips) wrote their clips under the same keys (``<guild>/job_<id>.mp4``) and their recaps
under the same ``recaps/story_<id>_...``: each overwrote, deleted and posted the other's. This revision gives the
database an id of its own, made once, here; the bot prefixes every key it makes with it (``<game>/<guild>/...``,
``<game>/recaps/...``). Keys already stored stay as they were written and are read as before; a backup restored
keeps its game's id.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = "game_id"


def upgrade() -> None:
    app_state = sa.table("app_state", sa.column("key", sa.String), sa.column("value", sa.Text))
    op.execute(app_state.insert().values(key=KEY, value=f"g{secrets.token_hex(8)}"))


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM app_state WHERE key = :key").bindparams(key=KEY))
