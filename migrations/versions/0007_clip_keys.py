"""turns.clip_key: a clip named by its key in the bot's clip store, not by a path

Before, turns.clip_path held the path the bot wrote the clip to, relative to the working directory it
was started from (``data/clips/<guild>/job_<id>.mp4``): a bot started elsewhere read every clip as
missing, and retention deleted none. A key (``<guild>/job_<id>.mp4``) is resolved under the bot's clip
folder (``<data_dir>/clips``) by whichever process reads it. Each stored path becomes the part after its
last ``clips/``; a path without one (none was written so) is kept and read as the path it is.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FOLDER = "clips/"
DEFAULT_FOLDER = "data/clips/"  # where the bot wrote clips under its default data folder before this revision
BATCH = 1000


def key_of(path: str) -> str:
    posix = path.replace("\\", "/")
    if posix.startswith(FOLDER):
        return posix[len(FOLDER) :]
    at = posix.rfind("/" + FOLDER)
    return posix[at + 1 + len(FOLDER) :] if at >= 0 else path


def _rewrite(column: str, change) -> None:
    """Rewrite every non-NULL value of ``turns.<column>``, a batch at a time."""
    bind = op.get_bind()
    turns = sa.table("turns", sa.column("id", sa.Integer), sa.column(column, sa.String))
    last = 0
    while True:
        rows = bind.execute(
            sa.select(turns.c.id, turns.c[column])
            .where(turns.c[column].is_not(None), turns.c.id > last)
            .order_by(turns.c.id)
            .limit(BATCH)
        ).all()
        if not rows:
            return
        changed = [{"turn": turn_id, "value": change(value)} for turn_id, value in rows if change(value) != value]
        if changed:
            bind.execute(
                turns.update().where(turns.c.id == sa.bindparam("turn")).values({column: sa.bindparam("value")}),
                changed,
            )
        last = rows[-1][0]


def _partial(where: str) -> dict[str, sa.TextClause]:
    return {"sqlite_where": sa.text(where), "postgresql_where": sa.text(where)}


def upgrade() -> None:
    op.drop_index("ix_turns_with_clip", table_name="turns")
    op.alter_column("turns", "clip_path", new_column_name="clip_key", existing_type=sa.String(1024))
    _rewrite("clip_key", key_of)
    op.create_index("ix_turns_with_clip", "turns", ["created_at", "id"], **_partial("clip_key IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_turns_with_clip", table_name="turns")
    op.alter_column("turns", "clip_key", new_column_name="clip_path", existing_type=sa.String(1024))
    _rewrite("clip_path", lambda key: key if key.startswith("/") else DEFAULT_FOLDER + key)
    op.create_index("ix_turns_with_clip", "turns", ["created_at", "id"], **_partial("clip_path IS NOT NULL"))
