"""Replicas: the live processes, which one holds each elicitation's ACP connection, and who told its completion.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COMPLETION_PENDING = (
    "status = 'completed' AND replica_id IS NOT NULL "
    "AND (completion_delivery IS NULL OR completion_delivery = 'delivering')"
)


def upgrade() -> None:
    # Expand only: nullable columns (plain ALTER TABLE, no table copy on SQLite), a partial index, a new table.
    op.add_column("elicitations", sa.Column("replica_id", sa.String(32), nullable=True))
    op.add_column("elicitations", sa.Column("completion_delivery", sa.String(16), nullable=True))
    op.create_index(
        "ix_elicitations_completion_pending",
        "elicitations",
        ["replica_id"],
        postgresql_where=sa.text(_COMPLETION_PENDING),
        sqlite_where=sa.text(_COMPLETION_PENDING),
    )
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_replicas"),
    )


def downgrade() -> None:
    op.drop_table("replicas")
    op.drop_index("ix_elicitations_completion_pending", table_name="elicitations")
    op.drop_column("elicitations", "completion_delivery")
    op.drop_column("elicitations", "replica_id")
