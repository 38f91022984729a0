"""Clip safety: each turn's detector report and why its clip was withheld; each server's safety policy

``turns.safety`` holds the worker's detector report (JSON, game.safety.SafetyReport) and ``turns.clip_withheld``
why the bot did not post the clip (NULL when it did). ``guild_settings.safety_policy`` says what a flagged clip gets
(withhold: posted nowhere; age_restricted: posted in age-restricted channels only) and ``safety_threshold`` the
score that flags one (NULL: the operator's ANIMEGAMER_SAFETY_THRESHOLD). Turns made before this revision were posted
unchecked and keep NULL.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

POLICIES = ("withhold", "age_restricted")  # game.safety.SafetyPolicy at this revision


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("safety", sa.Text(), nullable=True))
        batch.add_column(sa.Column("clip_withheld", sa.String(length=300), nullable=True))
    with op.batch_alter_table("guild_settings") as batch:
        batch.add_column(sa.Column("safety_policy", sa.String(length=16), nullable=False, server_default=POLICIES[0]))
        batch.add_column(sa.Column("safety_threshold", sa.Float(), nullable=True))
        batch.create_check_constraint(
            op.f("ck_guild_settings_safety_policy"), "safety_policy IN (" + ", ".join(f"'{p}'" for p in POLICIES) + ")"
        )
        batch.create_check_constraint(
            op.f("ck_guild_settings_safety_threshold_range"), "safety_threshold > 0 AND safety_threshold <= 1"
        )


def downgrade() -> None:
    with op.batch_alter_table("guild_settings") as batch:
        batch.drop_constraint(op.f("ck_guild_settings_safety_threshold_range"), type_="check")
        batch.drop_constraint(op.f("ck_guild_settings_safety_policy"), type_="check")
        batch.drop_column("safety_threshold")
        batch.drop_column("safety_policy")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("clip_withheld")
        batch.drop_column("safety")
