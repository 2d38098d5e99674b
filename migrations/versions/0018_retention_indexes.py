"""Retention's indexes: ended elicitations by `updated_at`, identity verifications by `expires_at` and ended webhook
deliveries by `last_attempt_at`, so that a retention pass (`service.store.retention`) reads only the rows it deletes,
never a whole table. The deliveries' `(status, last_attempt_at)` index (0010) goes: with two ended statuses it could
not give the oldest ended deliveries in order, and nothing else reads it. (Audit rows are purged in the order of
0017's `(at, id)` index and the event log's in that of its `at` index: nothing new for them.)

Expand only (indexes): code of the previous revision runs unchanged on this schema, so `OLDEST_SCHEMA_REVISION`
stays. On PostgreSQL each index is built with `CREATE INDEX CONCURRENTLY`, outside the migration's transaction:
the tables stay writable while it builds (it reads the table twice and waits for the transactions already open on
it; a few seconds per million rows on a 2-core machine). An index that a failed or interrupted build left invalid
is dropped and built again by the next `acp-connector migrate`.

Revision ID: 0018
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (name, table, columns)
INDEXES: list[tuple[str, str, list[str]]] = [
    ("ix_elicitations_updated_at", "elicitations", ["updated_at"]),
    ("ix_identity_verifications_expires_at", "identity_verifications", ["expires_at"]),
    ("ix_webhook_deliveries_last_attempt_at", "webhook_deliveries", ["last_attempt_at"]),
]
REPLACED = ("ix_webhook_deliveries_status_last_attempt_at", "webhook_deliveries", ["status", "last_attempt_at"])


def _online() -> bool:
    """PostgreSQL: build and drop without holding the tables' writers (CONCURRENTLY, outside a transaction)."""
    return op.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    if not _online():
        for name, table, columns in INDEXES:
            op.create_index(name, table, columns)
        op.drop_index(REPLACED[0], table_name=REPLACED[1])
        return
    with op.get_context().autocommit_block():
        for name, table, columns in INDEXES:
            # What an interrupted CONCURRENTLY build leaves behind (an invalid index) goes first.
            op.drop_index(name, table_name=table, postgresql_concurrently=True, if_exists=True)
            op.create_index(name, table, columns, postgresql_concurrently=True)
        op.drop_index(REPLACED[0], table_name=REPLACED[1], postgresql_concurrently=True, if_exists=True)


def downgrade() -> None:
    name, table, columns = REPLACED
    if not _online():
        op.create_index(name, table, columns)
        for name, table, _ in reversed(INDEXES):
            op.drop_index(name, table_name=table)
        return
    with op.get_context().autocommit_block():
        op.drop_index(name, table_name=table, postgresql_concurrently=True, if_exists=True)
        op.create_index(name, table, columns, postgresql_concurrently=True)
        for name, table, _ in reversed(INDEXES):
            op.drop_index(name, table_name=table, postgresql_concurrently=True)
