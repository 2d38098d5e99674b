"""Several accounts per provider: a grant's account label and name, and the account an elicitation asks for.

- `grants.account_label`: the name the user gave the account on the consent page ("work"), else the provider's
  profile name; unique among one user's accounts at a provider (`service.core.accounts`). NULL for grants stored
  before this revision (they are shown by their profile name, or as an unnamed account).
- `grants.account_name`: the provider's own name for the account (its login, e-mail address or user name, from the
  profile), the `login_hint` sent when that account is asked for again. NULL when the provider named none.
- `elicitations.account`: which account the elicitation is for (JSON: what the agent named, the accounts held, the
  provider's name for the account asked again or that it is a new one; NULL: a first account, none named).

Expand only (nullable columns): code of the previous revision runs unchanged on this schema (it neither reads nor
writes them). This revision's code reads them, so it declares this revision its oldest schema
(`service.store.schema.OLDEST_SCHEMA_REVISION`).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns: plain ALTER TABLEs (no table copy on SQLite), nothing an older replica's queries notice.
    op.add_column("grants", sa.Column("account_label", sa.String(128), nullable=True))
    op.add_column("grants", sa.Column("account_name", sa.String(128), nullable=True))
    op.add_column("elicitations", sa.Column("account", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("elicitations", "account")
    op.drop_column("grants", "account_name")
    op.drop_column("grants", "account_label")
