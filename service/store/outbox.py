"""The elicitation event log (outbox): terminal changes in commit order, read back by "id > last seen".

`append` runs inside the transaction that makes the change, so an event is in the log exactly when its change is
committed. Readers (this process's shared poll, a LISTEN/NOTIFY catch-up, a Server-Sent-Events stream resumed
with Last-Event-ID) keep the last id they saw and ask for what follows. That is only safe if ids become visible
in increasing order, which a plain sequence does not give on PostgreSQL (a transaction that drew id 10 may commit
after one that drew 11, and a reader at 11 would skip 10). So on PostgreSQL every append first takes one
transaction-level advisory lock, in the same statement: appends are serialised from the lock to the commit, and
an id is drawn only by the lock holder. On SQLite the one writer at a time gives the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    String,
    column,
    func,
    insert,
    literal,
    select,
    true,
    values,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.events import ElicitationEvent
from service.core.states import ElicitationStatus

from .engine import Database
from .tables import UTCDateTime
from .tables import elicitation_events as table

# pg_advisory_xact_lock key of the event log: any fixed 64-bit number no other lock in the database uses.
ORDER_LOCK_KEY = 0x6163_706F_7574_6278  # "acpoutbx"
_COLUMNS = ("elicitation_id", "connection_key", "status", "at", "origin")
_APPEND = insert(table).returning(table.c.id, table.c.elicitation_id, sort_by_parameter_order=True)


class OutboxRepository:
    def __init__(self, db: Database, origin: str) -> None:
        self._db = db
        self.origin = origin

    async def append(
        self, events: Sequence[ElicitationEvent], *, at: datetime, conn: AsyncConnection
    ) -> list[ElicitationEvent]:
        """Log `events` in the caller's transaction (make it the transaction's last statement: on PostgreSQL
        it holds the log's order lock until the commit). Returns the events with their `id` and `at`."""
        if not events:
            return []
        rows = [(e.elicitation_id, e.connection_key, e.status.value, at, self.origin) for e in events]
        if conn.dialect.name == "postgresql":
            given = values(
                column("elicitation_id", String),
                column("connection_key", String),
                column("status", String),
                column("at", UTCDateTime),
                column("origin", String),
                name="given",
            ).data(rows)
            # OFFSET 0 keeps the lock in its own subquery, evaluated before the row (and its id) is produced.
            ordered = select(func.pg_advisory_xact_lock(literal(ORDER_LOCK_KEY, BigInteger)).label("l")).offset(0)
            source = select(*(given.c[name] for name in _COLUMNS)).select_from(
                ordered.subquery("ordered").join(given, true())
            )
            statement = insert(table).from_select(list(_COLUMNS), source)
            result = await conn.execute(statement.returning(table.c.id, table.c.elicitation_id))
        else:
            result = await conn.execute(_APPEND, [dict(zip(_COLUMNS, row, strict=True)) for row in rows])
        ids = {elicitation_id: id for id, elicitation_id in result.all()}
        return [
            ElicitationEvent(
                e.elicitation_id,
                e.status,
                e.connection_key,
                id=ids[e.elicitation_id],
                at=at,
                origin=self.origin,
                reason=e.reason,
                grant=e.grant,
            )
            for e in events
        ]

    async def after(
        self, last_id: int, *, limit: int = 500, conn: AsyncConnection | None = None
    ) -> list[ElicitationEvent]:
        """Events with an id greater than `last_id`, oldest first (at most `limit`)."""
        statement = select(table).where(table.c.id > last_id).order_by(table.c.id).limit(limit)
        async with self._db.read(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return [
            ElicitationEvent(
                row["elicitation_id"],
                ElicitationStatus(row["status"]),
                row["connection_key"],
                id=row["id"],
                at=row["at"],
                origin=row["origin"],
            )
            for row in rows
        ]

    async def last_id(self, conn: AsyncConnection | None = None) -> int:
        """The id of the newest event (0 when the log is empty): where a new reader starts."""
        async with self._db.read(conn) as c:
            return int((await c.execute(select(func.coalesce(func.max(table.c.id), 0)))).scalar_one())
