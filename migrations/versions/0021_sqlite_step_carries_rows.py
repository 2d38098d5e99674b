"""SQLite: the OAuth flow a step starts and a user's first grant written by the step's own statement, through triggers.

0020 lets a step's UPDATE write its audit and event-log rows through triggers that copy its `step_note`; the flow row
started at Continue and the first grant stored at the completion stayed statements of their own, because each holds
a ciphertext (the PKCE verifier's, the tokens') that JSON cannot hold (SQLite 3.40 has no unhex()). Here the step's
UPDATE also carries them (`service.store.step_writes`):

    step_note: {..., "oauth_flows": {every column but verifier_ciphertext}}   (Continue)
               {..., "grants": {every column but token_ciphertext}}           (a first grant's completion)
    step_blob: the row's ciphertext (a BLOB bound as is)

and two triggers do the rest. `elicitations_step_carried` (BEFORE UPDATE OF step_note, beside 0020's) inserts the
row with the ciphertext taken from `step_blob`; `elicitations_step_cleared` (AFTER UPDATE OF step_note) then sets
`step_note` and `step_blob` back to NULL on the row, so that no ciphertext (nor the grant's account) stays on the
elicitation once the statement is done. Both fire only for a note that carries such a row. They copy and clear; they
decide nothing: whether the step happens, and for a first grant that its account holds none (`NOT EXISTS`), are the
statement's WHERE (a trigger's INSERT of a grant that was not the first would fail the statement, not replace one).
A statement that fails undoes its triggers' rows and clears with it.

`elicitations.step_blob` is added on both databases (one schema); PostgreSQL never sets it and has no triggers.

Expand only: code of the previous revision never names `step_blob` nor puts these keys in a note, so the new triggers
never fire for its statements, and it writes its flow rows and grants itself as before. This revision's code needs
them on SQLite (without them the flow row and the first grant would not be written), so it declares this revision its
oldest schema (`service.store.schema.OLDEST_SCHEMA_REVISION`). The downgrade drops the two triggers and the column;
0020's triggers stay.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FLOW_COLUMNS = (
    "id",
    "elicitation_id",
    "state_hash",
    "verifier_key_id",
    "nonce",
    "expected_issuer",
    "browser_binding_hash",
    "redirect_uri",
    "created_at",
    "expires_at",
    "used_at",
)
GRANT_COLUMNS = (
    "id",
    "identity_issuer",
    "identity_subject",
    "provider",
    "provider_account_id",
    "scopes",
    "refused_scopes",
    "token_key_id",
    "token_expires_at",
    "created_at",
    "updated_at",
    "health_status",
    "health_reason",
    "health_changed_at",
    "last_refresh_at",
    "last_failure_at",
    "next_refresh_at",
    "refresh_failures",
    "tenant",
    "account_label",
    "account_name",
)
# Each table's row in the note, and the column its ciphertext goes to (from `step_blob`).
CARRIED = {"oauth_flows": (FLOW_COLUMNS, "verifier_ciphertext"), "grants": (GRANT_COLUMNS, "token_ciphertext")}
TRIGGERS = ("elicitations_step_carried", "elicitations_step_cleared")
_CARRIES = " OR ".join(f"json_type(NEW.step_note, '$.{table}') IS NOT NULL" for table in CARRIED)


def _copy(table: str, columns: Sequence[str], blob: str) -> str:
    """The trigger statement inserting the note's row of `table` with `step_blob` as its ciphertext, if it has one."""
    values = ", ".join(f"json_extract(NEW.step_note, '$.{table}.{c}')" for c in columns)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}, {blob}) SELECT {values}, NEW.step_blob "
        f"WHERE json_type(NEW.step_note, '$.{table}') IS NOT NULL;"
    )


def _sqlite() -> bool:
    return op.get_context().dialect.name == "sqlite"


def upgrade() -> None:
    op.add_column("elicitations", sa.Column("step_blob", sa.LargeBinary(), nullable=True))
    if not _sqlite():
        return
    copies = " ".join(_copy(table, columns, blob) for table, (columns, blob) in CARRIED.items())
    op.execute(
        f"CREATE TRIGGER {TRIGGERS[0]} BEFORE UPDATE OF step_note ON elicitations WHEN {_CARRIES} BEGIN {copies} END"
    )
    clear = "UPDATE elicitations SET step_note = NULL, step_blob = NULL WHERE id = NEW.id;"
    after = f"AFTER UPDATE OF step_note ON elicitations WHEN {_CARRIES}"
    op.execute(f"CREATE TRIGGER {TRIGGERS[1]} {after} BEGIN {clear} END")


def downgrade() -> None:
    if _sqlite():
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_column("elicitations", "step_blob")
