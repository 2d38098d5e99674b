"""Rolling upgrades: the schema records the oldest code revision that still runs on it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Expand only: code written for 0002 runs on this schema (service.store.schema reads this after every upgrade).
oldest_code_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "schema_compatibility",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("oldest_code_revision", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_schema_compatibility"),
    )


def downgrade() -> None:
    op.drop_table("schema_compatibility")
