"""Duties several bot processes share: a leases table, and each story's recap claim

``leases`` names a duty one process does at a time (sending turns to the broker, the retention sweep),
who holds it and until when. ``stories.recapped_at`` and ``stories.recap_started_at`` hold /story recap's
cooldown and the recap being made, which each process kept in its own memory before, so two processes
could each make the same minute-long recap at once.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    with op.batch_alter_table("stories") as batch:
        batch.add_column(sa.Column("recapped_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("recap_started_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stories") as batch:
        batch.drop_column("recap_started_at")
        batch.drop_column("recapped_at")
    op.drop_table("leases")
