"""clip_deletes: stored objects whose deletion is owed, kept until the store has done it

A removal, a purge or a retention sweep cleared the clip's key in its row and then asked the store to delete the
object; a store that was down then lost the deletion for good (S3Store.delete logged it and went on), and the
object stayed in the bucket forever, withheld clips included. Now the key is recorded here in the same transaction
that clears it, removed once the store has deleted the object, and retried by every bot process's retention loop
until then.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "clip_deletes",
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_clip_deletes")),
    )


def downgrade() -> None:
    op.drop_table("clip_deletes")
