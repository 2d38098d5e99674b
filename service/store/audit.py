"""The audit trail: append-only events about elicitations and grants, never holding secrets."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import RowMapping, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.identity import Identity

from .engine import connection_scope, dump_json, load_json
from .records import AuditRecord
from .tables import audit_events


class AuditRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def record(
        self,
        event: str,
        *,
        elicitation_id: str | None = None,
        identity: Identity | None = None,
        provider: str | None = None,
        detail: Mapping[str, Any] | None = None,
        now: datetime | None = None,
        conn: AsyncConnection | None = None,
    ) -> None:
        """Append one event. `detail` must be JSON-serialisable and must not hold secrets."""
        values = {
            "at": now if now is not None else datetime.now(UTC),
            "event": event,
            "elicitation_id": elicitation_id,
            "identity_issuer": None if identity is None else identity.issuer,
            "identity_subject": None if identity is None else identity.subject,
            "provider": provider,
            "detail": dump_json(dict(detail or {})),
        }
        async with connection_scope(self._engine, conn) as c:
            await c.execute(insert(audit_events).values(values))

    async def list(
        self,
        *,
        elicitation_id: str | None = None,
        event: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> builtins.list[AuditRecord]:
        """Events matching every filter given, oldest first."""
        statement = select(audit_events).order_by(audit_events.c.id)
        if elicitation_id is not None:
            statement = statement.where(audit_events.c.elicitation_id == elicitation_id)
        if event is not None:
            statement = statement.where(audit_events.c.event == event)
        async with connection_scope(self._engine, conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return [_from_row(row) for row in rows]


def _from_row(row: RowMapping) -> AuditRecord:
    issuer, subject = row["identity_issuer"], row["identity_subject"]
    return AuditRecord(
        id=row["id"],
        at=row["at"],
        event=row["event"],
        elicitation_id=row["elicitation_id"],
        identity=None if issuer is None or subject is None else Identity(issuer, subject),
        provider=row["provider"],
        detail=load_json(row["detail"]),
    )
