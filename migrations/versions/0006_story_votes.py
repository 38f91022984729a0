"""Vote-order stories: the channel proposes the next turn, votes, and each round's winner is played

stories.turn_order takes 'vote', stories.round_seconds says how long a round stays open, and three
tables hold the rounds, the proposals and the votes.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_ORDERS = ("free", "round_robin")
NEW_ORDERS = (*OLD_ORDERS, "vote")


def _check(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    with op.batch_alter_table("stories") as batch:
        batch.drop_constraint(op.f("ck_stories_turn_order"), type_="check")
        batch.create_check_constraint(op.f("ck_stories_turn_order"), _check("turn_order", NEW_ORDERS))
        batch.add_column(sa.Column("round_seconds", sa.Integer(), nullable=True))
    op.create_table(
        "story_rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("story_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "open",
                "closed",
                name=op.f("ck_story_rounds_status"),
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            server_default="open",
            nullable=False,
        ),
        sa.Column("closes_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("message_id", sa.BigInteger(), nullable=True),
        sa.Column("winner_id", sa.Integer(), nullable=True),
        sa.Column("turn_id", sa.Integer(), nullable=True),
        sa.Column("announced", sa.Boolean(), server_default=sa.false(), nullable=False),
        _created_at(),
        sa.ForeignKeyConstraint(
            ["story_id"], ["stories.id"], name=op.f("fk_story_rounds_story_id_stories"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_story_rounds_turn_id_turns"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_story_rounds")),
        sa.UniqueConstraint("story_id", "number", name=op.f("uq_story_rounds_story_id_number")),
    )
    op.create_index(
        "uq_story_rounds_one_open_per_story",
        "story_rounds",
        ["story_id"],
        unique=True,
        sqlite_where=sa.text("status = 'open'"),
        postgresql_where=sa.text("status = 'open'"),
    )
    op.create_index("ix_story_rounds_status_closes_at", "story_rounds", ["status", "closes_at"])
    op.create_table(
        "story_proposals",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("character_id", sa.Integer(), nullable=False),
        sa.Column("instruction", sa.String(length=200), nullable=False),
        _created_at(),
        sa.ForeignKeyConstraint(
            ["round_id"], ["story_rounds.id"], name=op.f("fk_story_proposals_round_id_story_rounds"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["character_id"],
            ["characters.id"],
            name=op.f("fk_story_proposals_character_id_characters"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_story_proposals")),
        sa.UniqueConstraint("round_id", "user_id", name=op.f("uq_story_proposals_round_id_user_id")),
    )
    op.create_index(op.f("ix_story_proposals_character_id"), "story_proposals", ["character_id"])
    op.create_table(
        "story_votes",
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("proposal_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["round_id"], ["story_rounds.id"], name=op.f("fk_story_votes_round_id_story_rounds"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["proposal_id"],
            ["story_proposals.id"],
            name=op.f("fk_story_votes_proposal_id_story_proposals"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("round_id", "user_id", name=op.f("pk_story_votes")),
    )
    op.create_index(op.f("ix_story_votes_proposal_id"), "story_votes", ["proposal_id"])


def downgrade() -> None:
    op.drop_table("story_votes")
    op.drop_table("story_proposals")
    op.drop_table("story_rounds")
    op.execute(sa.text("DELETE FROM stories WHERE turn_order = 'vote'"))  # no earlier revision can hold them
    with op.batch_alter_table("stories") as batch:
        batch.drop_column("round_seconds")
        batch.drop_constraint(op.f("ck_stories_turn_order"), type_="check")
        batch.create_check_constraint(op.f("ck_stories_turn_order"), _check("turn_order", OLD_ORDERS))
