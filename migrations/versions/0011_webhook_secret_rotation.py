"""Rotating a webhook endpoint's signing secret: the previous secret (encrypted like the current one) and when it
stops signing.

Expand only (nullable columns): code of the previous revision runs unchanged on this schema (it neither reads nor
writes these columns; an endpoint it creates has no previous secret). This revision's code reads them, so it
declares this revision its oldest schema (`service.store.schema.OLDEST_SCHEMA_REVISION`).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns: a plain ALTER TABLE (no table copy on SQLite), nothing an older replica's queries notice.
    op.add_column("webhook_endpoints", sa.Column("previous_secret_key_id", sa.String(64), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("previous_secret_ciphertext", sa.LargeBinary(), nullable=True))
    op.add_column(
        "webhook_endpoints", sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("webhook_endpoints", "previous_secret_expires_at")
    op.drop_column("webhook_endpoints", "previous_secret_ciphertext")
    op.drop_column("webhook_endpoints", "previous_secret_key_id")
