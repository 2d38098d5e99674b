"""OAuth flow rows: one per authorization request, found by the hash of its state, claimable once."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import LABEL_STYLE_TABLENAME_PLUS_COL, bindparam, exists, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.records import ElicitationRecord, FlowRecord

from .elicitations import from_row as elicitation_from_row
from .engine import Database
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
    select(oauth_flows, elicitations, _GRANT_HELD)
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


class FlowRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(self, rec: FlowRecord, conn: AsyncConnection | None = None) -> None:
        async with self._db.write(conn) as c:
            await c.execute(_INSERT, _to_row(rec))

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
        if row is None:
            return None
        flow, record = (
            _from_row(_columns_of(row, oauth_flows.name)),
            elicitation_from_row(_columns_of(row, elicitations.name)),
        )
        return flow, record, bool(row["grant_held"])

    async def claim(self, state_hash: str, now: datetime, conn: AsyncConnection | None = None) -> FlowRecord | None:
        """Use the flow once: set `used_at` if it is unused and unexpired, in one UPDATE.

        Returns the claimed record, or None when the flow is unknown, already used, or expired. Of two
        concurrent claimers exactly one gets the record.
        """
        async with self._db.write(conn) as c:
            row = (await c.execute(_CLAIM, {"state": state_hash, "now": now})).mappings().first()
        return None if row is None else _from_row(row)

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


def _to_row(rec: FlowRecord) -> dict[str, Any]:
    return {
        "id": rec.id,
        "elicitation_id": rec.elicitation_id,
        "state_hash": rec.state_hash,
        "verifier_key_id": rec.verifier_key_id,
        "verifier_ciphertext": rec.verifier_ciphertext,
        "nonce": rec.nonce,
        "expected_issuer": rec.expected_issuer,
        "browser_binding_hash": rec.browser_binding_hash,
        "redirect_uri": rec.redirect_uri,
        "created_at": rec.created_at,
        "expires_at": rec.expires_at,
        "used_at": rec.used_at,
    }


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
