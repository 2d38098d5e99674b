"""Grant health (is the grant usable, and if not why; refresh times and backoff) and grant events in the event log.

Expand only (nullable columns): code of the previous revision runs unchanged on this schema. It neither reads nor
writes the grant health columns (a grant it stores or refreshes keeps what they say; a row whose tokens changed
after it was marked `needs_user` is read as active again). The event log gains `kind` and `detail`: a grant
event's row has `kind` set (e.g. `grant.needs_user`), the grant's id in `elicitation_id`, a status the previous
release reads (`failed`) and a connection key that names no tenant, so a previous-release replica reading the log
takes it for the end of an elicitation nobody waits for and routes it nowhere. This revision's code reads the new
columns, so it declares this revision its oldest schema (`service.store.schema.OLDEST_SCHEMA_REVISION`).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GRANT_COLUMNS = (
    ("health_status", sa.String(16)),
    ("health_reason", sa.String(32)),
    ("health_changed_at", sa.DateTime(timezone=True)),
    ("last_refresh_at", sa.DateTime(timezone=True)),
    ("last_failure_at", sa.DateTime(timezone=True)),
    ("next_refresh_at", sa.DateTime(timezone=True)),
    ("refresh_failures", sa.Integer()),
)
EVENT_COLUMNS = (("kind", sa.String(32)), ("detail", sa.Text()))


def upgrade() -> None:
    # Nullable columns: a plain ALTER TABLE (no table copy on SQLite), nothing an older replica's queries notice.
    for name, type_ in GRANT_COLUMNS:
        op.add_column("grants", sa.Column(name, type_, nullable=True))
    for name, type_ in EVENT_COLUMNS:
        op.add_column("elicitation_events", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(EVENT_COLUMNS):
        op.drop_column("elicitation_events", name)
    for name, _ in reversed(GRANT_COLUMNS):
        op.drop_column("grants", name)
