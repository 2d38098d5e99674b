"""Retention of webhook deliveries: an index to find ended ones by their last attempt, oldest first.

Expand only (a new index): code of the previous revision runs unchanged on this schema, and this revision's code
runs on the previous schema (the purge reads the same columns, only without the index).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-14
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_webhook_deliveries_status_last_attempt_at", "webhook_deliveries", ["status", "last_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_status_last_attempt_at", table_name="webhook_deliveries")
