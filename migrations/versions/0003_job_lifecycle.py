"""the job lifecycle: expired jobs, the outbox, deadlines, cancel marks, post attempts; turns' model keys

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Written by hand:
- ``jobs.status`` gains ``expired``: the CHECK behind the string enum is dropped and made again;
- ``jobs.sent_at`` (the outbox), ``attempts``, ``deadline_at``, ``cancel_marked_at``, ``post_attempts``;
  jobs already sent before this revision are marked sent (their task went out with them);
- ``turns.model_key`` says which weights made a representation, so a prompt never mixes them;
  filled from ``model`` (and, for the published model, the character's name);
- ``turns.character_id`` becomes nullable: a story keeps the turns of a player who started over.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_STATES = ("queued", "running", "done", "failed", "cancelled")
NEW_STATES = (*OLD_STATES, "expired")
RELEASE_MODEL = "animegamer"  # relay.celery_app.RELEASE_MODEL; revisions never import app code


def _status_check(states: tuple[str, ...]) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in states) + ")"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("ck_jobs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_jobs_status"), _status_check(NEW_STATES))
        batch.add_column(sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False))
        batch.add_column(sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("cancel_marked_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("post_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False))
        batch.create_check_constraint(op.f("ck_jobs_attempts_range"), "attempts >= 0")
    op.execute("UPDATE jobs SET sent_at = queued_at, attempts = 1")

    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("model_key", sa.String(length=100), nullable=True))
        batch.alter_column("character_id", existing_type=sa.Integer(), nullable=True)
    op.execute(f"UPDATE turns SET model_key = model WHERE model != '{RELEASE_MODEL}'")
    op.execute(
        f"UPDATE turns SET model_key = '{RELEASE_MODEL}:' || "
        "lower((SELECT name FROM characters WHERE characters.id = turns.character_id)) "
        f"WHERE model = '{RELEASE_MODEL}'"
    )


def downgrade() -> None:
    op.execute("DELETE FROM turns WHERE character_id IS NULL")
    with op.batch_alter_table("turns") as batch:
        batch.alter_column("character_id", existing_type=sa.Integer(), nullable=False)
        batch.drop_column("model_key")
    op.execute("UPDATE jobs SET status = 'failed' WHERE status = 'expired'")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("ck_jobs_attempts_range"), type_="check")
        batch.drop_column("post_attempts")
        batch.drop_column("cancel_marked_at")
        batch.drop_column("deadline_at")
        batch.drop_column("attempts")
        batch.drop_column("sent_at")
        batch.drop_constraint(op.f("ck_jobs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_jobs_status"), _status_check(OLD_STATES))
