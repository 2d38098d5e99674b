"""Per-connection values an agent gives with an elicitation (a tenant, a shop's subdomain), for the provider's URLs.

Expand only (a nullable column): code of the previous revision runs unchanged on this schema (it neither reads nor
writes it; its elicitations have none). This revision's code reads it, so it declares this revision its oldest
schema (`service.store.schema.OLDEST_SCHEMA_REVISION`).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column: a plain ALTER TABLE (no table copy on SQLite), nothing an older replica's queries notice.
    op.add_column("elicitations", sa.Column("connection_values", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("elicitations", "connection_values")
