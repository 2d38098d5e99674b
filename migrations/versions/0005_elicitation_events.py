"""The elicitation event log (outbox): one row per terminal change, ordered, ids only.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Expand only: older code never reads or writes this table (oldest_code_revision stays as declared before).


def upgrade() -> None:
    op.create_table(
        "elicitation_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("elicitation_id", sa.String(64), nullable=False),
        sa.Column("connection_key", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("origin", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_elicitation_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_elicitation_events_at", "elicitation_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_elicitation_events_at", table_name="elicitation_events")
    op.drop_table("elicitation_events")
