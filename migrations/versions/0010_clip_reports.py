"""Clip reports: players report posted clips to their server's admins; a clip taken down is dated

``clip_reports`` holds one report per player and clip, open until an admin removes the clip or dismisses the
reports. ``turns.clip_removed_at`` says when a posted clip was taken down (its message and stored clip deleted,
the turn's text and state kept).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "clip_reports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("guild_id", sa.BigInteger(), nullable=False),
        sa.Column("turn_id", sa.Integer(), nullable=False),
        sa.Column("reporter_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolution", sa.String(length=16), nullable=True),
        sa.Column("resolved_by", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["guild_id"], ["guilds.id"], name=op.f("fk_clip_reports_guild_id_guilds"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_clip_reports_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clip_reports")),
        sa.UniqueConstraint("turn_id", "reporter_id", name=op.f("uq_clip_reports_turn_id_reporter_id")),
    )
    op.create_index("ix_clip_reports_guild_id_resolved_at", "clip_reports", ["guild_id", "resolved_at"])
    op.create_index(op.f("ix_clip_reports_turn_id"), "clip_reports", ["turn_id"])
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("clip_removed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("clip_removed_at")
    op.drop_index(op.f("ix_clip_reports_turn_id"), table_name="clip_reports")
    op.drop_index("ix_clip_reports_guild_id_resolved_at", table_name="clip_reports")
    op.drop_table("clip_reports")
