"""Narrowed grants: the scopes the provider refused when the grant was made.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Expand only (a nullable column, NULL meaning "none refused"): older code still runs on this schema.


def upgrade() -> None:
    op.add_column("grants", sa.Column("refused_scopes", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("grants", "refused_scopes")  # native DROP COLUMN (SQLite 3.35+)
