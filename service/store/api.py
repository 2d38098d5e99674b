"""Rows of the `/v1` API: its keys (hashed), and the tenant and idempotency key of API-created elicitations."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.records import ApiElicitationRecord, ApiKeyRecord

from .engine import Database, dump_json, load_json
from .tables import api_elicitations, api_keys


class ApiKeyRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(self, rec: ApiKeyRecord, conn: AsyncConnection | None = None) -> None:
        values = {
            "id": rec.id,
            "key_hash": rec.key_hash,
            "tenant": rec.tenant,
            "agent_name": rec.agent_name,
            "providers": None if rec.providers is None else dump_json(list(rec.providers)),
            "created_at": rec.created_at,
            "revoked_at": rec.revoked_at,
        }
        async with self._db.write(conn) as c:
            await c.execute(insert(api_keys).values(values))

    async def by_hash(self, key_hash: str, conn: AsyncConnection | None = None) -> ApiKeyRecord | None:
        """The key with this hash, revoked or not."""
        async with self._db.read(conn) as c:
            row = (await c.execute(select(api_keys).where(api_keys.c.key_hash == key_hash))).mappings().first()
        return None if row is None else _key_from_row(row)

    async def list(self, conn: AsyncConnection | None = None) -> list[ApiKeyRecord]:
        """Every key, oldest first."""
        async with self._db.read(conn) as c:
            rows = (await c.execute(select(api_keys).order_by(api_keys.c.created_at, api_keys.c.id))).mappings()
            return [_key_from_row(row) for row in rows.all()]

    async def revoke(self, id: str, now: datetime, conn: AsyncConnection | None = None) -> bool:
        """Revoke the key; False when there is no such key or it was revoked before."""
        statement = update(api_keys).where(api_keys.c.id == id, api_keys.c.revoked_at.is_(None)).values(revoked_at=now)
        async with self._db.write(conn) as c:
            result = await c.execute(statement)
        return result.rowcount > 0


class ApiElicitationRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def claim(self, rec: ApiElicitationRecord, conn: AsyncConnection | None = None) -> bool:
        """Insert the row unless the tenant already used its idempotency key; True when inserted.

        A conflict does not abort the surrounding transaction (INSERT ... ON CONFLICT DO NOTHING).
        """
        values = {
            "elicitation_id": rec.elicitation_id,
            "tenant": rec.tenant,
            "idempotency_key": rec.idempotency_key,
            "connection_id": rec.connection_id,
            "created_at": rec.created_at,
            "answered_at": rec.answered_at,
        }
        async with self._db.write(conn) as c:
            dialect = c.dialect.name
            if dialect == "postgresql":
                statement: Any = postgresql.insert(api_elicitations).values(values).on_conflict_do_nothing()
            elif dialect == "sqlite":
                statement = sqlite.insert(api_elicitations).values(values).on_conflict_do_nothing()
            else:  # pragma: no cover - only the two supported backends are configured
                raise NotImplementedError(f"idempotent insert is not implemented for {dialect}")
            result = await c.execute(statement)
        return result.rowcount > 0

    async def get(self, elicitation_id: str, conn: AsyncConnection | None = None) -> ApiElicitationRecord | None:
        statement = select(api_elicitations).where(api_elicitations.c.elicitation_id == elicitation_id)
        async with self._db.read(conn) as c:
            row = (await c.execute(statement)).mappings().first()
        return None if row is None else _elicitation_from_row(row)

    async def by_idempotency_key(
        self, tenant: str, idempotency_key: str, conn: AsyncConnection | None = None
    ) -> ApiElicitationRecord | None:
        statement = select(api_elicitations).where(
            api_elicitations.c.tenant == tenant, api_elicitations.c.idempotency_key == idempotency_key
        )
        async with self._db.read(conn) as c:
            row = (await c.execute(statement)).mappings().first()
        return None if row is None else _elicitation_from_row(row)

    async def mark_answered(self, elicitation_id: str, now: datetime, conn: AsyncConnection | None = None) -> bool:
        """Record that the client's answer arrived, once: False when it was recorded before."""
        statement = (
            update(api_elicitations)
            .where(api_elicitations.c.elicitation_id == elicitation_id, api_elicitations.c.answered_at.is_(None))
            .values(answered_at=now)
        )
        async with self._db.write(conn) as c:
            result = await c.execute(statement)
        return result.rowcount > 0


def _key_from_row(row: RowMapping) -> ApiKeyRecord:
    providers = row["providers"]
    return ApiKeyRecord(
        id=row["id"],
        key_hash=row["key_hash"],
        tenant=row["tenant"],
        agent_name=row["agent_name"],
        providers=None if providers is None else tuple(load_json(providers)),
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
    )


def _elicitation_from_row(row: RowMapping) -> ApiElicitationRecord:
    return ApiElicitationRecord(
        elicitation_id=row["elicitation_id"],
        tenant=row["tenant"],
        idempotency_key=row["idempotency_key"],
        connection_id=row["connection_id"],
        created_at=row["created_at"],
        answered_at=row["answered_at"],
    )
