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
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Insert,
    RowMapping,
    bindparam,
    func,
    insert,
    literal,
    select,
    true,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.events import ElicitationEvent, GrantEvent, GrantEventKind, LoggedEvent
from service.core.identity import Identity
from service.core.states import ElicitationStatus

from .engine import Database, dump_json, load_json
from .tables import elicitation_events as table

# pg_advisory_xact_lock key of the event log: any fixed 64-bit number no other lock in the database uses.
ORDER_LOCK_KEY = 0x6163_706F_7574_6278  # "acpoutbx"
_COLUMNS = ("elicitation_id", "connection_key", "status", "at", "origin", "kind", "detail")
# The rows' ids are matched to the events by (elicitation or grant id, kind), not by order: one multi-row statement.
_APPEND = insert(table).returning(table.c.id, table.c.elicitation_id, table.c.kind)
_PER_EVENT = ("elicitation_id", "connection_key", "status", "kind", "detail")  # `at` and `origin`: one per append
E = TypeVar("E", ElicitationEvent, GrantEvent)
# A grant event's row, as the previous release reads it (migration 0012): the end of an elicitation that nobody
# waits for (its id is the grant's), on a connection key that names no tenant, so it is routed nowhere.
GRANT_ROW_STATUS = ElicitationStatus.FAILED.value
GRANT_ROW_KEY = "grant"


def _row(event: LoggedEvent, at: datetime, origin: str) -> tuple[object, ...]:
    if isinstance(event, GrantEvent):
        key = GRANT_ROW_KEY if event.tenant is None else f"v1:{event.tenant}:{GRANT_ROW_KEY}"
        detail = dump_json(event.detail())
        return (event.grant_id, key, GRANT_ROW_STATUS, at, origin, event.kind.value, detail)
    return (event.elicitation_id, event.connection_key, event.status.value, at, origin, None, None)


def _key(event: LoggedEvent) -> tuple[str, str | None]:
    if isinstance(event, GrantEvent):
        return event.grant_id, event.kind.value
    return event.elicitation_id, None


def _from_row(row: RowMapping) -> LoggedEvent:
    if row["kind"] is None:
        return ElicitationEvent(
            row["elicitation_id"],
            ElicitationStatus(row["status"]),
            row["connection_key"],
            id=row["id"],
            at=row["at"],
            origin=row["origin"],
        )
    detail = load_json(row["detail"] or "{}")
    key = row["connection_key"]
    return GrantEvent(
        GrantEventKind(row["kind"]),
        row["elicitation_id"],
        Identity(str(detail.get("issuer", "")), str(detail.get("subject", ""))),
        str(detail.get("provider", "")),
        str(detail.get("account_id", "")),
        reason=detail.get("reason"),
        tenant=key[3:].partition(":")[0] if key.startswith("v1:") else None,
        id=row["id"],
        at=row["at"],
        origin=row["origin"],
    )


def _pg_append() -> Insert:
    """PostgreSQL: append the events given as one array per column (`<column>s`), after the log's order lock.

    Built once with arrays, not a VALUES list of the events: building and compiling a VALUES construct of 200 rows
    took ~100 ms of the event loop (a sweeper batch), the arrays take none beyond the statement's cached form."""
    # OFFSET 0 keeps the lock in its own subquery, evaluated before the row (and its id) is produced.
    ordered = select(func.pg_advisory_xact_lock(literal(ORDER_LOCK_KEY, BigInteger)).label("l")).offset(0)
    given = (
        func.unnest(*(bindparam(f"{name}s", type_=ARRAY(table.c[name].type)) for name in _PER_EVENT))
        .table_valued(*_PER_EVENT, with_ordinality="n")
        .render_derived(name="given")
    )
    source = (
        select(
            given.c.elicitation_id,
            given.c.connection_key,
            given.c.status,
            bindparam("at", type_=table.c.at.type),
            bindparam("origin", type_=table.c.origin.type),
            given.c.kind,
            given.c.detail,
        )
        .select_from(ordered.subquery("ordered").join(given, true()))
        .order_by(given.c.n)
    )
    return insert(table).from_select(list(_COLUMNS), source).returning(table.c.id, table.c.elicitation_id, table.c.kind)


_PG_APPEND = _pg_append()


def logged_insert_of(changed: Any) -> Any:
    """PostgreSQL: a CTE appending the event of `event_*` parameters (`event_row`) for each row of the CTE `changed`,
    after the log's order lock (as `append` takes it), returning its id: an ending logged in its change's statement.
    That statement must be its transaction's last (the lock is held until the commit)."""
    ordered = select(func.pg_advisory_xact_lock(literal(ORDER_LOCK_KEY, BigInteger)).label("l")).offset(0)
    given = select(*(bindparam(f"event_{n}", type_=table.c[n].type) for n in _COLUMNS)).select_from(
        ordered.subquery("ordered").join(changed, true())
    )
    return insert(table).from_select(list(_COLUMNS), given).returning(table.c.id).cte("logged")


class OutboxRepository:
    def __init__(self, db: Database, origin: str) -> None:
        self._db = db
        self.origin = origin

    async def append(self, events: Sequence[E], *, at: datetime, conn: AsyncConnection) -> list[E]:
        """Log `events` in the caller's transaction (make it the transaction's last statement: on PostgreSQL
        it holds the log's order lock until the commit). Returns the events with their `id`, `at` and `origin`."""
        if not events:
            return []
        rows = [_row(e, at, self.origin) for e in events]
        if conn.dialect.name == "postgresql":
            columns = dict(zip(_COLUMNS, zip(*rows, strict=True), strict=True))
            given: dict[str, Any] = {f"{name}s": list(columns[name]) for name in _PER_EVENT}
            result = await conn.execute(_PG_APPEND, {**given, "at": at, "origin": self.origin})
        else:
            result = await conn.execute(_APPEND, [dict(zip(_COLUMNS, row, strict=True)) for row in rows])
        ids = {(logged, kind): id for id, logged, kind in result.all()}
        return [replace(e, id=ids[_key(e)], at=at, origin=self.origin) for e in events]

    def event_row(self, event: ElicitationEvent, at: datetime) -> dict[str, Any]:
        """`event`'s row as this process appends it, for a change's statement that logs it (`logged_insert_of`)."""
        return dict(zip(_COLUMNS, _row(event, at, self.origin), strict=True))

    def logged(self, event: E, id: int, at: datetime) -> E:
        """`event` as appended with `id` at `at` by this process."""
        return replace(event, id=id, at=at, origin=self.origin)

    async def after(self, last_id: int, *, limit: int = 500, conn: AsyncConnection | None = None) -> list[LoggedEvent]:
        """Events with an id greater than `last_id`, oldest first (at most `limit`)."""
        statement = select(table).where(table.c.id > last_id).order_by(table.c.id).limit(limit)
        async with self._db.read(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return [_from_row(row) for row in rows]

    async def last_id(self, conn: AsyncConnection | None = None) -> int:
        """The id of the newest event (0 when the log is empty): where a new reader starts."""
        async with self._db.read(conn) as c:
            return int((await c.execute(select(func.coalesce(func.max(table.c.id), 0)))).scalar_one())
