"""indexes for every hot query, one turn in flight per player, retention's clip expiry

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Written by hand:
- ``uq_jobs_one_in_flight_per_player``: a partial unique index over jobs queued or running, so two
  bots (or shards) racing to queue a turn for one player cannot both succeed. A database that
  already holds two in flight for a player (possible before: the rule was checked per character)
  keeps the oldest; the newer ones are cancelled first, and the supervisor tells their workers;
- ``ix_jobs_guild_id_status_user_id`` (turns in flight: a server's, a player's),
  ``ix_jobs_guild_id_user_id_queued_at`` (the hourly quota), ``ix_jobs_status_finished_at`` (how
  often turns finish, for ETAs), ``ix_jobs_to_post`` and
  ``ix_jobs_cancels_to_mark`` (the few rows the delivery and the supervisor look for each tick,
  where ``(status, id)`` walked every finished job). A cancelled job that was never sent counts as
  its workers told (there are none), so the cancels to mark stay few: existing ones are marked;
- ``ix_turns_character_id`` becomes ``(character_id, id)``: newest turns first on PostgreSQL too;
- ``ix_turns_with_representation`` and ``ix_turns_with_clip`` (partial): what retention has left
  to look at; ``turns.clip_expired_at`` records when retention deleted a turn's clip.

The partial indexes' WHERE clauses are written with the values themselves, as ``db.models`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IN_FLIGHT = "status IN ('queued', 'running')"


def _partial(where: str) -> dict[str, sa.TextClause]:
    return {"sqlite_where": sa.text(where), "postgresql_where": sa.text(where)}


def upgrade() -> None:
    op.execute(
        "UPDATE jobs SET status = 'cancelled', finished_at = CURRENT_TIMESTAMP, deadline_at = NULL, "
        "error = 'cancelled by revision 0004: the player had an older turn in flight' "
        f"WHERE {IN_FLIGHT} AND guild_id IS NOT NULL AND user_id IS NOT NULL AND EXISTS ("
        "SELECT 1 FROM jobs AS older WHERE older.guild_id = jobs.guild_id AND older.user_id = jobs.user_id "
        f"AND older.{IN_FLIGHT} AND older.id < jobs.id)"
    )
    op.create_index(
        "uq_jobs_one_in_flight_per_player", "jobs", ["guild_id", "user_id"], unique=True, **_partial(IN_FLIGHT)
    )
    op.execute(
        "UPDATE jobs SET cancel_marked_at = COALESCE(finished_at, CURRENT_TIMESTAMP) "
        "WHERE status = 'cancelled' AND sent_at IS NULL AND cancel_marked_at IS NULL"
    )
    op.create_index("ix_jobs_guild_id_status_user_id", "jobs", ["guild_id", "status", "user_id"])
    op.create_index("ix_jobs_guild_id_user_id_queued_at", "jobs", ["guild_id", "user_id", "queued_at"])
    op.create_index("ix_jobs_status_finished_at", "jobs", ["status", "finished_at"])
    # Partial on PostgreSQL only (db.models says why).
    op.create_index(
        "ix_jobs_to_post",
        "jobs",
        ["status", "result_message_id", "id"],
        postgresql_where=sa.text("status IN ('done') AND result_message_id IS NULL"),
    )
    op.create_index(
        "ix_jobs_cancels_to_mark",
        "jobs",
        ["status", "cancel_marked_at", "id"],
        postgresql_where=sa.text("status IN ('cancelled') AND cancel_marked_at IS NULL"),
    )

    op.drop_index(op.f("ix_turns_character_id"), table_name="turns")
    op.create_index("ix_turns_character_id_id", "turns", ["character_id", "id"])
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("clip_expired_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_turns_with_representation", "turns", ["created_at", "id"], **_partial("representation IS NOT NULL")
    )
    op.create_index("ix_turns_with_clip", "turns", ["created_at", "id"], **_partial("clip_path IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_turns_with_clip", table_name="turns")
    op.drop_index("ix_turns_with_representation", table_name="turns")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("clip_expired_at")
    op.drop_index("ix_turns_character_id_id", table_name="turns")
    op.create_index(op.f("ix_turns_character_id"), "turns", ["character_id"])

    op.drop_index("ix_jobs_cancels_to_mark", table_name="jobs")
    op.drop_index("ix_jobs_to_post", table_name="jobs")
    op.drop_index("ix_jobs_status_finished_at", table_name="jobs")
    op.drop_index("ix_jobs_guild_id_user_id_queued_at", table_name="jobs")
    op.drop_index("ix_jobs_guild_id_status_user_id", table_name="jobs")
    op.drop_index("uq_jobs_one_in_flight_per_player", table_name="jobs")
