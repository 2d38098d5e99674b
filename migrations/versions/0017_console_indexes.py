"""The operator console's keyset paging: an index per list order (time, id), per filter column before it, and
partial indexes for the overview's counts (grants that need the user, grants backing off after failures, open
elicitations).

Expand only (indexes): code of the previous revision runs unchanged on this schema, and this revision's code reads
no new column, so `OLDEST_SCHEMA_REVISION` stays. On a large PostgreSQL database the statements take a while and
hold a write lock on each table while they build; run the migration at a quiet time (the README's upgrade notes).

Revision ID: 0017
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = "status IN ('pending', 'consented', 'verified', 'authorizing')"

# (name, table, columns, partial condition)
INDEXES: list[tuple[str, str, list[str], str | None]] = [
    ("ix_grants_updated_at_id", "grants", ["updated_at", "id"], None),
    ("ix_grants_identity_subject_updated_at_id", "grants", ["identity_subject", "updated_at", "id"], None),
    ("ix_grants_provider_updated_at_id", "grants", ["provider", "updated_at", "id"], None),
    ("ix_grants_token_key_id", "grants", ["token_key_id"], None),
    ("ix_grants_needs_user", "grants", ["provider", "updated_at", "id"], "health_status IS NOT NULL"),
    ("ix_grants_failing", "grants", ["updated_at", "id"], "refresh_failures IS NOT NULL"),
    ("ix_elicitations_created_at_id", "elicitations", ["created_at", "id"], None),
    ("ix_elicitations_open", "elicitations", ["created_at", "id"], OPEN),
    ("ix_audit_events_at_id", "audit_events", ["at", "id"], None),
    ("ix_audit_events_identity_subject_at_id", "audit_events", ["identity_subject", "at", "id"], None),
    ("ix_audit_events_provider_at_id", "audit_events", ["provider", "at", "id"], None),
    ("ix_audit_events_event_at_id", "audit_events", ["event", "at", "id"], None),
    ("ix_webhook_deliveries_created_at_id", "webhook_deliveries", ["created_at", "id"], None),
    (
        "ix_webhook_deliveries_endpoint_id_created_at_id",
        "webhook_deliveries",
        ["endpoint_id", "created_at", "id"],
        None,
    ),
]


def upgrade() -> None:
    for name, table, columns, where in INDEXES:
        condition = None if where is None else sa.text(where)
        op.create_index(name, table, columns, postgresql_where=condition, sqlite_where=condition)


def downgrade() -> None:
    for name, table, _, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
