"""Identity-verification rows: the server-side state of a verifier that sends the browser away first.

One row per attempt (an OIDC sign-in at the operator's identity provider, or a confirm hand-off to the
operator's app). Handles that leave the server (the OIDC state, the confirm flow id, the return code) are
stored only as hashes; every step that consumes a row does so in one conditional UPDATE, so each is single-use.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.identity import Identity
from service.core.records import Intent, VerificationRecord

from .engine import Database
from .tables import identity_verifications as table


class VerificationRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(self, rec: VerificationRecord, conn: AsyncConnection | None = None) -> None:
        async with self._db.write(conn) as c:
            await c.execute(insert(table).values(_to_row(rec)))

    async def get_by_handle(self, handle_hash: str, conn: AsyncConnection | None = None) -> VerificationRecord | None:
        return await self._get(table.c.handle_hash == handle_hash, conn)

    async def get_by_return(self, return_hash: str, conn: AsyncConnection | None = None) -> VerificationRecord | None:
        return await self._get(table.c.return_hash == return_hash, conn)

    async def claim(self, id: str, now: datetime, conn: AsyncConnection | None = None) -> VerificationRecord | None:
        """Use the row once: set `used_at` if unused and unexpired. None when used, expired or unknown.

        A confirm row is claimable only after the operator confirmed it. Of two concurrent claimers exactly one wins.
        """
        statement = (
            update(table)
            .where(
                table.c.id == id,
                table.c.used_at.is_(None),
                table.c.expires_at > now,
                (table.c.verifier != "confirm") | table.c.confirmed_at.is_not(None),
            )
            .values(used_at=now)
            .returning(*table.c)
        )
        return await self._one(statement, conn)

    async def confirm(
        self,
        id: str,
        *,
        identity: Identity,
        outcome: str,
        return_hash: str,
        now: datetime,
        conn: AsyncConnection | None = None,
    ) -> VerificationRecord | None:
        """Record the operator's answer once: None when already confirmed, used, expired or unknown."""
        statement = (
            update(table)
            .where(
                table.c.id == id,
                table.c.confirmed_at.is_(None),
                table.c.used_at.is_(None),
                table.c.expires_at > now,
            )
            .values(
                confirmed_at=now,
                outcome=outcome,
                identity_issuer=identity.issuer,
                identity_subject=identity.subject,
                return_hash=return_hash,
            )
            .returning(*table.c)
        )
        return await self._one(statement, conn)

    async def open_by_key(self, now: datetime, conn: AsyncConnection | None = None) -> dict[str, int]:
        """How many unused, unexpired verifications hold a PKCE verifier under each vault key id."""
        statement = (
            select(table.c.pkce_key_id, func.count())
            .where(table.c.pkce_key_id.is_not(None), table.c.used_at.is_(None), table.c.expires_at > now)
            .group_by(table.c.pkce_key_id)
        )
        async with self._db.read(conn) as c:
            return {key_id: count for key_id, count in (await c.execute(statement)).all()}

    async def _get(self, condition: Any, conn: AsyncConnection | None) -> VerificationRecord | None:
        async with self._db.read(conn) as c:
            row = (await c.execute(select(table).where(condition))).mappings().first()
        return None if row is None else _from_row(row)

    async def _one(self, statement: Any, conn: AsyncConnection | None) -> VerificationRecord | None:
        async with self._db.write(conn) as c:
            row = (await c.execute(statement)).mappings().first()
        return None if row is None else _from_row(row)


def _to_row(rec: VerificationRecord) -> dict[str, Any]:
    return {
        "id": rec.id,
        "elicitation_id": rec.elicitation_id,
        "verifier": rec.verifier,
        "handle_hash": rec.handle_hash,
        "return_hash": rec.return_hash,
        "browser_binding_hash": rec.browser_binding_hash,
        "nonce": rec.nonce,
        "pkce_key_id": rec.pkce_key_id,
        "pkce_ciphertext": rec.pkce_ciphertext,
        "outcome": rec.outcome,
        "identity_issuer": None if rec.identity is None else rec.identity.issuer,
        "identity_subject": None if rec.identity is None else rec.identity.subject,
        "created_at": rec.created_at,
        "expires_at": rec.expires_at,
        "confirmed_at": rec.confirmed_at,
        "used_at": rec.used_at,
        "intent": rec.intent.value,
    }


def _from_row(row: RowMapping) -> VerificationRecord:
    issuer, subject, ciphertext = row["identity_issuer"], row["identity_subject"], row["pkce_ciphertext"]
    return VerificationRecord(
        id=row["id"],
        elicitation_id=row["elicitation_id"],
        verifier=row["verifier"],
        handle_hash=row["handle_hash"],
        return_hash=row["return_hash"],
        browser_binding_hash=row["browser_binding_hash"],
        nonce=row["nonce"],
        pkce_key_id=row["pkce_key_id"],
        pkce_ciphertext=None if ciphertext is None else bytes(ciphertext),
        outcome=row["outcome"],
        identity=None if issuer is None or subject is None else Identity(issuer, subject),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        confirmed_at=row["confirmed_at"],
        used_at=row["used_at"],
        intent=Intent(row["intent"] or Intent.CONTINUE),
    )
