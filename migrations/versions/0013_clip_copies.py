"""clip_copies: the posted messages (a /story recap, a /story page) that hold copies of turns' clips

Removing a clip deleted its own message and stored object, but a recap already posted kept playing it, a story page
file kept it embedded, and the kept recap object stayed in the store until the story's next recap. Each such post is
now a row naming the turns it holds; a removal, a purge or an expiry of one of them marks the row withdrawn in its
own transaction (and owes the kept recap's deletion in clip_deletes), and the bot deletes the message, retrying
each minute until Discord has it gone.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "clip_copies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("story_id", sa.Integer(), nullable=False),
        sa.Column("guild_id", sa.BigInteger(), nullable=True),
        sa.Column("channel_id", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.BigInteger(), nullable=False),
        sa.Column("turn_ids", sa.Text(), nullable=False),
        sa.Column("recap_key", sa.String(length=512), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("withdrawn_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clip_copies")),
    )
    op.create_index("ix_clip_copies_story_id", "clip_copies", ["story_id"])
    op.create_index(
        "ix_clip_copies_withdrawn",
        "clip_copies",
        ["id"],
        sqlite_where=sa.text("withdrawn_at IS NOT NULL"),
        postgresql_where=sa.text("withdrawn_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_clip_copies_withdrawn", table_name="clip_copies")
    op.drop_index("ix_clip_copies_story_id", table_name="clip_copies")
    op.drop_table("clip_copies")
