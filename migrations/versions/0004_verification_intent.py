"""Decline after the identity step: a verification remembers which button sent the browser to sign in.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-14
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Expand only (a nullable column, NULL meaning "continue"): older code still runs on this schema.


def upgrade() -> None:
    op.add_column("identity_verifications", sa.Column("intent", sa.String(16), nullable=True))


def downgrade() -> None:
    op.drop_column("identity_verifications", "intent")  # native DROP COLUMN (SQLite 3.35+)
