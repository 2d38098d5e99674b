"""SQLite: a step's audit row (and an ending's event-log row) written by the step's own statement, through triggers.

PostgreSQL writes the rows that go with a step's change (its audit row, the event-log row of an ending) in the
change's statement, with data-modifying CTEs; SQLite has none. Here the change's INSERT or UPDATE sets
`elicitations.step_note`, a JSON object holding those rows as stored (`service.store.step_writes`):

    {"audit_events": {at, event, elicitation_id, identity_issuer, identity_subject, provider, detail},
     "elicitation_events": {elicitation_id, connection_key, status, at, origin, kind, detail}}   (the second: an ending)

and two triggers insert them. They copy; they decide nothing (which rows a step writes, and whether the change may
happen, is the statement's). `AFTER INSERT` for a new elicitation; `BEFORE UPDATE OF step_note` for a change, which
SQLite fires for each row the UPDATE's WHERE matched whose SET names the column (a step whose UPDATE matches no
row writes nothing), before the row is written so that the statement's RETURNING can read the event-log row's id.
A statement that fails undoes its triggers' rows with it. The note stays on the row (the last step's, no secret:
the audit trail holds none); nothing reads it.

`elicitations.step_note` is added on both databases (one schema); PostgreSQL never sets it and has no triggers.

Expand only: code of the previous revision never sets the column, so the triggers never fire for it. This
revision's code needs them on SQLite (without them a step's audit row would not be written), so it declares this
revision its oldest schema (`service.store.schema.OLDEST_SCHEMA_REVISION`). SQLite serves one process (replicas
need PostgreSQL): there is no rolling upgrade with code of two releases on one SQLite database; stop, migrate,
start. A later migration that rebuilds `elicitations` on SQLite (a batch "move and copy") drops these triggers with
the old table and must create them again (tests/test_migrations.py checks they exist at the head).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AUDIT_COLUMNS = ("at", "event", "elicitation_id", "identity_issuer", "identity_subject", "provider", "detail")
EVENT_COLUMNS = ("elicitation_id", "connection_key", "status", "at", "origin", "kind", "detail")
TRIGGERS = ("elicitations_step_inserted", "elicitations_step_updated")


def _copy(table: str, columns: Sequence[str]) -> str:
    """The trigger statement inserting the note's row of `table`, if the note has one."""
    values = ", ".join(f"json_extract(NEW.step_note, '$.{table}.{c}')" for c in columns)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {values} "
        f"WHERE json_type(NEW.step_note, '$.{table}') IS NOT NULL;"
    )


_BODY = f"BEGIN {_copy('audit_events', AUDIT_COLUMNS)} {_copy('elicitation_events', EVENT_COLUMNS)} END"


def _sqlite() -> bool:
    return op.get_context().dialect.name == "sqlite"


def upgrade() -> None:
    op.add_column("elicitations", sa.Column("step_note", sa.Text(), nullable=True))
    if not _sqlite():
        return
    op.execute(f"CREATE TRIGGER {TRIGGERS[0]} AFTER INSERT ON elicitations WHEN NEW.step_note IS NOT NULL {_BODY}")
    op.execute(
        f"CREATE TRIGGER {TRIGGERS[1]} BEFORE UPDATE OF step_note ON elicitations "
        f"WHEN NEW.step_note IS NOT NULL {_BODY}"
    )


def downgrade() -> None:
    if _sqlite():
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_column("elicitations", "step_note")
