"""OAuth flow rows: one per authorization request, found by the hash of its state, claimable once."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import LABEL_STYLE_TABLENAME_PLUS_COL, bindparam, exists, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.records import ElicitationRecord, FlowRecord

from .elicitation_rows import elicitation_columns
from .elicitation_rows import from_row as elicitation_from_row
from .engine import Database
from .flow_rows import flow_row
from .tables import elicitations, grants, oauth_flows

# The statements every flow runs, built once (building and keying a statement costs more than running it).
_INSERT = insert(oauth_flows)
# Whether the elicitation's user holds a grant at its provider: when not, the completion inserts its grant without
# reading an earlier one first (`GrantRepository.insert_new`).
_GRANT_HELD = (
    exists()
    .where(
        grants.c.identity_issuer == elicitations.c.identity_issuer,
        grants.c.identity_subject == elicitations.c.identity_subject,
        grants.c.provider == elicitations.c.provider,
    )
    .label("grant_held")
)
_WITH_ELICITATION = (
    select(oauth_flows, *elicitation_columns, _GRANT_HELD)
    .join(elicitations, elicitations.c.id == oauth_flows.c.elicitation_id)
    .where(oauth_flows.c.state_hash == bindparam("state"))
    .set_label_style(LABEL_STYLE_TABLENAME_PLUS_COL)
)
_CLAIM = (
    update(oauth_flows)
    .where(
        oauth_flows.c.state_hash == bindparam("state"),
        oauth_flows.c.used_at.is_(None),
        oauth_flows.c.expires_at > bindparam("now"),
    )
    .values(used_at=bindparam("now"))
    .returning(*oauth_flows.c)
)


# The callback's claim with its reads: the flow used once, only by the browser that started it, at its provider, while
# its elicitation may still finish; with the elicitation's row and whether its user holds a grant there. PostgreSQL
# returns the joined row (UPDATE ... FROM); SQLite returns only the updated table's columns, so there each elicitation
# column is a subquery by primary key.
_CLAIM_CONDITIONS = (
    oauth_flows.c.state_hash == bindparam("state"),
    oauth_flows.c.used_at.is_(None),
    oauth_flows.c.expires_at > bindparam("now"),
    oauth_flows.c.browser_binding_hash == bindparam("binding"),
)
_ITS_ELICITATION = (
    elicitations.c.id == oauth_flows.c.elicitation_id,
    elicitations.c.provider == bindparam("provider"),
    elicitations.c.status.in_(bindparam("statuses", expanding=True)),
)
_CLAIM_WITH_ELICITATION = {
    "postgresql": update(oauth_flows)
    .where(*_CLAIM_CONDITIONS, *_ITS_ELICITATION)
    .values(used_at=bindparam("now"))
    .returning(
        *(c.label(f"oauth_flows_{c.name}") for c in oauth_flows.c),
        *(c.label(f"elicitations_{c.name}") for c in elicitation_columns),
        _GRANT_HELD,
    ),
    "sqlite": update(oauth_flows)
    .where(*_CLAIM_CONDITIONS, exists().where(*_ITS_ELICITATION))
    .values(used_at=bindparam("now"))
    .returning(
        *(c.label(f"oauth_flows_{c.name}") for c in oauth_flows.c),
        *(
            select(c)
            .where(elicitations.c.id == oauth_flows.c.elicitation_id)
            .scalar_subquery()
            .label(f"elicitations_{c.name}")
            for c in elicitation_columns
        ),
        select(_GRANT_HELD)
        .where(elicitations.c.id == oauth_flows.c.elicitation_id)
        .scalar_subquery()
        .label("grant_held"),
    ),
}


class FlowRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(self, rec: FlowRecord, conn: AsyncConnection | None = None) -> None:
        async with self._db.write(conn) as c:
            await c.execute(_INSERT, flow_row(rec))

    async def get_by_state_hash(self, state_hash: str, conn: AsyncConnection | None = None) -> FlowRecord | None:
        async with self._db.read(conn) as c:
            statement = select(oauth_flows).where(oauth_flows.c.state_hash == state_hash)
            row = (await c.execute(statement)).mappings().first()
        return None if row is None else _from_row(row)

    async def get_with_elicitation(
        self, state_hash: str, conn: AsyncConnection | None = None
    ) -> tuple[FlowRecord, ElicitationRecord, bool] | None:
        """The flow with this state hash, its elicitation, and whether that elicitation's user holds a grant at its
        provider (any account, any tenant), in one read (None when the state is unknown)."""
        async with self._db.read(conn) as c:
            row = (await c.execute(_WITH_ELICITATION, {"state": state_hash})).mappings().first()
        return None if row is None else _with_elicitation(row)

    async def claim(self, state_hash: str, now: datetime, conn: AsyncConnection | None = None) -> FlowRecord | None:
        """Use the flow once: set `used_at` if it is unused and unexpired, in one UPDATE.

        Returns the claimed record, or None when the flow is unknown, already used, or expired. Of two
        concurrent claimers exactly one gets the record.
        """
        async with self._db.write(conn) as c:
            row = (await c.execute(_CLAIM, {"state": state_hash, "now": now})).mappings().first()
        return None if row is None else _from_row(row)

    async def claim_with_elicitation(
        self,
        state_hash: str,
        now: datetime,
        *,
        provider: str,
        binding_hash: str,
        statuses: Collection[str],
        conn: AsyncConnection | None = None,
    ) -> tuple[FlowRecord, ElicitationRecord, bool] | None:
        """`claim` the flow if the browser is the one that started it (`binding_hash`), its elicitation is at
        `provider` and in one of `statuses`, in one statement that also returns the elicitation and whether its user
        holds a grant at its provider (as `get_with_elicitation`). None when any of that does not hold (nothing
        changed then: the caller reads why)."""
        params = {"state": state_hash, "now": now, "provider": provider, "binding": binding_hash}
        async with self._db.write_alone(conn) as c:  # on the callback's path: committed with its statement
            statement = _CLAIM_WITH_ELICITATION[c.dialect.name]
            row = (await c.execute(statement, {**params, "statuses": list(statuses)})).mappings().first()
        return None if row is None else _with_elicitation(row)

    async def open_by_key(self, now: datetime, conn: AsyncConnection | None = None) -> dict[str, int]:
        """How many unused, unexpired flows hold a PKCE verifier under each vault key id."""
        statement = (
            select(oauth_flows.c.verifier_key_id, func.count())
            .where(
                oauth_flows.c.verifier_key_id.is_not(None),
                oauth_flows.c.used_at.is_(None),
                oauth_flows.c.expires_at > now,
            )
            .group_by(oauth_flows.c.verifier_key_id)
        )
        async with self._db.read(conn) as c:
            return {key_id: count for key_id, count in (await c.execute(statement)).all()}

    async def invalidate_open(self, elicitation_id: str, now: datetime, conn: AsyncConnection | None = None) -> int:
        """Mark every unused flow of the elicitation as used; return how many were open."""
        statement = (
            update(oauth_flows)
            .where(oauth_flows.c.elicitation_id == elicitation_id, oauth_flows.c.used_at.is_(None))
            .values(used_at=now)
        )
        async with self._db.write(conn) as c:
            result = await c.execute(statement)
        return result.rowcount


def _columns_of(row: Mapping[Any, Any], table: str) -> dict[str, Any]:
    prefix = f"{table}_"
    return {key[len(prefix) :]: value for key, value in row.items() if key.startswith(prefix)}


def _from_row(row: Mapping[Any, Any]) -> FlowRecord:
    ciphertext = row["verifier_ciphertext"]
    return FlowRecord(
        id=row["id"],
        elicitation_id=row["elicitation_id"],
        state_hash=row["state_hash"],
        verifier_key_id=row["verifier_key_id"],
        verifier_ciphertext=None if ciphertext is None else bytes(ciphertext),
        nonce=row["nonce"],
        expected_issuer=row["expected_issuer"],
        browser_binding_hash=row["browser_binding_hash"],
        redirect_uri=row["redirect_uri"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        used_at=row["used_at"],
    )


def _with_elicitation(row: Mapping[Any, Any]) -> tuple[FlowRecord, ElicitationRecord, bool]:
    """A row of `_WITH_ELICITATION` or `_CLAIM_WITH_ELICITATION`: the flow, its elicitation, whether its user holds a
    grant at its provider."""
    flow = _from_row(_columns_of(row, oauth_flows.name))
    return flow, elicitation_from_row(_columns_of(row, elicitations.name)), bool(row["grant_held"])
