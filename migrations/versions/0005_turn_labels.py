"""turns.label: what a viewer must be told about the model that made a turn, as its worker said

Before, the bot derived a clip's label from the model name it was configured with, so a turn made
by a worker of another model (random weights at the published sizes, for one) was posted unlabelled.
Turns made before this revision get the label their model's name implies.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# game.contract's labels as they were written at this revision (a migration must not change with the code).
LABELS = {
    "tiny": "tiny model, random weights",
    "full": "full-size model, random weights",
    "toy": "toy model, trained on the toy world",
}


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("label", sa.String(100), nullable=True))
    turns = sa.table("turns", sa.column("model", sa.String), sa.column("label", sa.String))
    for model, label in LABELS.items():
        op.execute(turns.update().where(turns.c.model == model).values(label=label))


def downgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("label")
