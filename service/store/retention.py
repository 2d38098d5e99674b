"""Retention: deleting rows past their window, in small batches. Grants are never deleted here.

Each kind names its table and what makes a row old enough: an elicitation once it has *ended* and not changed
since the cutoff (its OAuth flows and identity verifications go with it, by foreign-key cascade); a verification
once it expired before the cutoff; audit and event-log rows once written before it; a webhook delivery once it has
ended (delivered or failed; never one still pending or being attempted) with its last attempt before the cutoff
(its attempt rows go with it, by foreign-key cascade). A batch is one short write
transaction (`DELETE ... WHERE id IN (oldest `limit` ids)`), so purging never holds the writer for long.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Table, delete, func, select

from service.core.retention import PurgeKind
from service.core.states import TERMINAL, DeliveryStatus

from .engine import Database
from .tables import audit_events, elicitation_events, elicitations, identity_verifications, webhook_deliveries

DELIVERIES_ENDED = sorted(s.value for s in (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED))


def _old(kind: PurgeKind, before: datetime) -> tuple[Table, ColumnElement[bool], Any]:
    """The table, the condition for a row past its window, and the column to delete oldest first by."""
    if kind is PurgeKind.ELICITATIONS:
        ended = elicitations.c.status.in_(sorted(s.value for s in TERMINAL))
        return elicitations, ended & (elicitations.c.updated_at < before), elicitations.c.updated_at
    if kind is PurgeKind.VERIFICATIONS:
        table = identity_verifications
        return table, table.c.expires_at < before, table.c.expires_at
    if kind is PurgeKind.AUDIT:
        return audit_events, audit_events.c.at < before, audit_events.c.id
    if kind is PurgeKind.WEBHOOK_DELIVERIES:
        d = webhook_deliveries.c
        return webhook_deliveries, d.status.in_(DELIVERIES_ENDED) & (d.last_attempt_at < before), d.last_attempt_at
    return elicitation_events, elicitation_events.c.at < before, elicitation_events.c.id


class RetentionRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def count(self, kind: PurgeKind, before: datetime) -> int:
        """How many rows of `kind` are past a window that ends at `before`."""
        table, condition, _ = _old(kind, before)
        async with self._db.read() as c:
            return int((await c.execute(select(func.count()).select_from(table).where(condition))).scalar_one())

    async def purge(self, kind: PurgeKind, before: datetime, *, limit: int) -> int:
        """Delete up to `limit` rows of `kind` past the window, oldest first, in one transaction; how many."""
        table, condition, oldest = _old(kind, before)
        batch = select(table.c.id).where(condition).order_by(oldest).limit(limit)
        async with self._db.write() as c:
            result = await c.execute(delete(table).where(table.c.id.in_(batch.scalar_subquery())))
        return result.rowcount
