"""Rows of signed webhooks: endpoints, deliveries (one event for one endpoint), attempts, and the fan-out cursor.

Two decisions are taken by the database, so that any number of replicas may deliver: the fan-out cursor moves by a
compare-and-swap (`enqueue`: only the replica that read from the current cursor writes the deliveries), and each
attempt is claimed by one conditional UPDATE (`claim_due`; on PostgreSQL the candidate rows are locked with SKIP
LOCKED, so concurrent claimers take different rows; SQLite has one writer at a time).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, and_, delete, func, insert, literal, or_, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.records import AttemptRecord, WebhookDeliveryRecord, WebhookEndpointRecord
from service.core.states import DeliveryStatus

from .engine import Database
from .sealed import swap_sealed
from .tables import webhook_attempts, webhook_cursor, webhook_deliveries, webhook_endpoints

CURSOR_ROW = 1
# Where an endpoint's sealed secrets are: (key id, ciphertext) columns.
_secret = (webhook_endpoints.c.secret_key_id, webhook_endpoints.c.secret_ciphertext)
_previous_secret = (webhook_endpoints.c.previous_secret_key_id, webhook_endpoints.c.previous_secret_ciphertext)
WAITING = (DeliveryStatus.PENDING.value, DeliveryStatus.DELIVERING.value)  # neither delivered nor given up


class _CursorMoved(Exception):
    """Another replica fanned out the same log entries first: roll back."""


class WebhookRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    # -- endpoints ------------------------------------------------------------------------------------------
    async def insert_endpoint(self, rec: WebhookEndpointRecord, conn: AsyncConnection | None = None) -> None:
        values = {
            "id": rec.id,
            "tenant": rec.tenant,
            "url": rec.url,
            "description": rec.description,
            "secret_key_id": rec.secret_key_id,
            "secret_ciphertext": rec.secret_ciphertext,
            "after_event_id": rec.after_event_id,
            "created_at": rec.created_at,
        }
        async with self._db.write(conn) as c:
            await c.execute(insert(webhook_endpoints).values(values))

    async def endpoints(
        self, tenant: str | None = None, conn: AsyncConnection | None = None
    ) -> list[WebhookEndpointRecord]:
        """A tenant's endpoints (every tenant's without one), oldest first."""
        statement = select(webhook_endpoints).order_by(webhook_endpoints.c.created_at, webhook_endpoints.c.id)
        if tenant is not None:
            statement = statement.where(webhook_endpoints.c.tenant == tenant)
        async with self._db.read(conn) as c:
            return [_endpoint(row) for row in (await c.execute(statement)).mappings().all()]

    async def endpoint(self, id: str, conn: AsyncConnection | None = None) -> WebhookEndpointRecord | None:
        async with self._db.read(conn) as c:
            row = (await c.execute(select(webhook_endpoints).where(webhook_endpoints.c.id == id))).mappings().first()
        return None if row is None else _endpoint(row)

    async def delete_endpoint(self, id: str, conn: AsyncConnection | None = None) -> bool:
        """Delete the endpoint with its deliveries and attempts; False when there is no such endpoint."""
        async with self._db.write(conn) as c:
            deliveries = select(webhook_deliveries.c.id).where(webhook_deliveries.c.endpoint_id == id)
            await c.execute(delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(deliveries)))
            await c.execute(delete(webhook_deliveries).where(webhook_deliveries.c.endpoint_id == id))
            result = await c.execute(delete(webhook_endpoints).where(webhook_endpoints.c.id == id))
        return result.rowcount > 0

    async def replace_secret(
        self,
        id: str,
        *,
        old_key_id: str,
        old_ciphertext: bytes,
        new_key_id: str,
        new_ciphertext: bytes,
        previous_expires_at: datetime | None,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """A secret rotation: the current secret becomes the previous one (its ciphertext as it is, until
        `previous_expires_at`; with None no previous secret is kept) and the new one current, in one conditional
        UPDATE, if the row still holds `old_*` as its current secret (a rotation or a key rotation meanwhile makes
        this False, and nothing changes). Whatever previous secret the row held is replaced."""
        keep = previous_expires_at is not None
        return await swap_sealed(
            self._db,
            *_secret,
            id,
            old=(old_key_id, old_ciphertext),
            new=(new_key_id, new_ciphertext),
            also={
                "previous_secret_key_id": old_key_id if keep else None,
                "previous_secret_ciphertext": old_ciphertext if keep else None,
                "previous_secret_expires_at": previous_expires_at,
            },
            conn=conn,
        )

    async def count_by_key(self, conn: AsyncConnection | None = None) -> dict[str, int]:
        """How many endpoint secrets each vault key id encrypts: current secrets and previous ones (expired or
        not: a previous secret still in its row is still encrypted under its key)."""
        e = webhook_endpoints.c
        current = select(e.secret_key_id, func.count()).group_by(e.secret_key_id)
        previous = (
            select(e.previous_secret_key_id, func.count())
            .where(e.previous_secret_key_id.is_not(None))
            .group_by(e.previous_secret_key_id)
        )
        counts: dict[str, int] = {}
        async with self._db.read(conn) as c:
            for statement in (current, previous):
                for key_id, count in (await c.execute(statement)).all():
                    counts[key_id] = counts.get(key_id, 0) + int(count)
        return counts

    async def secrets_not_under(
        self, key_id: str, *, previous: bool = False, after: str = "", limit: int, conn: AsyncConnection | None = None
    ) -> list[WebhookEndpointRecord]:
        """Up to `limit` endpoints whose secret (`previous`: whose previous secret, where one is kept) is under
        another key than `key_id`, by id, ids after `after` (a NULL key id, no previous secret, is never `!=`)."""
        key_column = (_previous_secret if previous else _secret)[0]
        statement = (
            select(webhook_endpoints)
            .where(key_column != key_id, webhook_endpoints.c.id > after)
            .order_by(webhook_endpoints.c.id)
            .limit(limit)
        )
        async with self._db.read(conn) as c:
            return [_endpoint(row) for row in (await c.execute(statement)).mappings().all()]

    async def swap_secret(
        self,
        id: str,
        *,
        previous: bool = False,
        old_key_id: str,
        old_ciphertext: bytes,
        new_key_id: str,
        new_ciphertext: bytes,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Replace an endpoint's encrypted secret (`previous`: its previous secret) if it still holds what was read
        (key rotation)."""
        key_column, ciphertext_column = _previous_secret if previous else _secret
        return await swap_sealed(
            self._db,
            key_column,
            ciphertext_column,
            id,
            old=(old_key_id, old_ciphertext),
            new=(new_key_id, new_ciphertext),
            conn=conn,
        )

    # -- fan-out --------------------------------------------------------------------------------------------
    async def cursor(self, conn: AsyncConnection | None = None) -> int:
        """The last event-log id turned into deliveries. The first call starts it just before what the oldest
        endpoint is to receive (events up to an endpoint's `after_event_id` are not sent to it)."""
        statement = select(webhook_cursor.c.last_event_id).where(webhook_cursor.c.id == CURSOR_ROW)
        async with self._db.read(conn) as c:
            found = (await c.execute(statement)).scalar()
        if found is not None:
            return int(found)
        # WHERE: SQLite reads `INSERT ... SELECT ... FROM t ON CONFLICT` as a join's ON without one.
        start = select(literal(CURSOR_ROW), func.coalesce(func.min(webhook_endpoints.c.after_event_id), 0)).where(
            true()
        )
        async with self._db.write(conn) as c:
            await c.execute(_insert_ignoring_conflict(c, webhook_cursor).from_select(["id", "last_event_id"], start))
        async with self._db.read(conn) as c:
            return int((await c.execute(statement)).scalar_one())

    async def enqueue(
        self,
        deliveries: Sequence[WebhookDeliveryRecord],
        *,
        from_cursor: int,
        to_cursor: int,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Move the cursor from `from_cursor` to `to_cursor` and write `deliveries`, in one transaction, if the
        cursor is still at `from_cursor`; False (nothing written) when another replica moved it first."""
        move = (
            update(webhook_cursor)
            .where(webhook_cursor.c.id == CURSOR_ROW, webhook_cursor.c.last_event_id == from_cursor)
            .values(last_event_id=to_cursor)
        )
        try:
            async with self._db.write(conn) as c:
                if (await c.execute(move)).rowcount == 0:
                    raise _CursorMoved
                if deliveries:
                    rows = [_delivery_values(d) for d in deliveries]
                    await c.execute(_insert_ignoring_conflict(c, webhook_deliveries), rows)
        except _CursorMoved:
            return False
        return True

    # -- attempts -------------------------------------------------------------------------------------------
    async def claim_due(
        self, *, now: datetime, replica_id: str, lease_until: datetime, limit: int
    ) -> list[WebhookDeliveryRecord]:
        """Take up to `limit` deliveries whose next attempt is due (or whose last claim's lease ran out) for
        `replica_id`, counting the attempt: one conditional UPDATE. The claimed rows, as they are now."""
        d = webhook_deliveries.c
        due = or_(
            and_(d.status == DeliveryStatus.PENDING.value, d.next_attempt_at <= now),
            and_(d.status == DeliveryStatus.DELIVERING.value, d.lease_until <= now),
        )
        candidates = select(d.id).where(due).order_by(d.next_attempt_at).limit(limit)
        async with self._db.read() as c:
            if (await c.execute(candidates.limit(1))).first() is None:
                return []  # the usual answer, found without taking SQLite's write lock
        candidates = candidates.with_for_update(skip_locked=True)
        statement = (
            update(webhook_deliveries)
            .where(d.id.in_(candidates.scalar_subquery()), due)
            .values(
                status=DeliveryStatus.DELIVERING.value,
                attempts=d.attempts + 1,
                claimed_by=replica_id,
                lease_until=lease_until,
                last_attempt_at=now,
            )
            .returning(*webhook_deliveries.c)
        )
        async with self._db.write() as c:
            rows = (await c.execute(statement)).mappings().all()
        return sorted((_delivery(row) for row in rows), key=lambda rec: (rec.event_id, rec.id))

    async def settle(
        self,
        delivery: WebhookDeliveryRecord,
        *,
        replica_id: str,
        status: DeliveryStatus,
        next_attempt_at: datetime | None,
        attempt: AttemptRecord,
    ) -> bool:
        """Record a claimed attempt and what follows it (`delivered`, `pending` again at `next_attempt_at`, or
        `failed`); the delivery changes only if this replica still holds this attempt. True when it did."""
        d = webhook_deliveries.c
        statement = (
            update(webhook_deliveries)
            .where(
                d.id == delivery.id,
                d.status == DeliveryStatus.DELIVERING.value,
                d.claimed_by == replica_id,
                d.attempts == delivery.attempts,
            )
            .values(
                status=status.value,
                next_attempt_at=next_attempt_at,
                claimed_by=None,
                lease_until=None,
                last_status_code=attempt.status_code,
                last_error=attempt.error,
                delivered_at=attempt.at if status is DeliveryStatus.DELIVERED else None,
            )
        )
        async with self._db.write() as c:
            await c.execute(
                insert(webhook_attempts).values(
                    delivery_id=attempt.delivery_id,
                    attempt=attempt.attempt,
                    replica_id=attempt.replica_id,
                    at=attempt.at,
                    status_code=attempt.status_code,
                    error=attempt.error,
                    duration_ms=attempt.duration_ms,
                )
            )
            return (await c.execute(statement)).rowcount > 0

    # -- reading --------------------------------------------------------------------------------------------
    async def backlog(self, conn: AsyncConnection | None = None) -> tuple[int, datetime | None]:
        """How many deliveries wait (pending, due or waiting for a retry, or in an attempt) and when the oldest of
        them was made (None when none waits): one aggregate read, over the waiting rows only (the status index)."""
        d = webhook_deliveries.c
        statement = select(func.count(), func.min(d.created_at)).where(d.status.in_(WAITING))
        async with self._db.read(conn) as c:
            count, oldest = (await c.execute(statement)).one()
        return int(count), oldest

    async def deliveries(
        self, endpoint_id: str, *, limit: int, conn: AsyncConnection | None = None
    ) -> list[WebhookDeliveryRecord]:
        """An endpoint's newest deliveries first."""
        statement = (
            select(webhook_deliveries)
            .where(webhook_deliveries.c.endpoint_id == endpoint_id)
            .order_by(webhook_deliveries.c.event_id.desc())
            .limit(limit)
        )
        async with self._db.read(conn) as c:
            return [_delivery(row) for row in (await c.execute(statement)).mappings().all()]

    async def attempts(self, delivery_id: str, conn: AsyncConnection | None = None) -> list[AttemptRecord]:
        statement = (
            select(webhook_attempts)
            .where(webhook_attempts.c.delivery_id == delivery_id)
            .order_by(webhook_attempts.c.attempt)
        )
        async with self._db.read(conn) as c:
            return [
                AttemptRecord(
                    delivery_id=row["delivery_id"],
                    attempt=row["attempt"],
                    replica_id=row["replica_id"],
                    at=row["at"],
                    status_code=row["status_code"],
                    error=row["error"],
                    duration_ms=row["duration_ms"],
                )
                for row in (await c.execute(statement)).mappings().all()
            ]


def _insert_ignoring_conflict(c: AsyncConnection, table: Any) -> Any:
    if c.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if c.dialect.name == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    raise NotImplementedError(f"idempotent insert is not implemented for {c.dialect.name}")  # pragma: no cover


def _endpoint(row: RowMapping) -> WebhookEndpointRecord:
    return WebhookEndpointRecord(
        id=row["id"],
        tenant=row["tenant"],
        url=row["url"],
        description=row["description"],
        secret_key_id=row["secret_key_id"],
        secret_ciphertext=row["secret_ciphertext"],
        after_event_id=int(row["after_event_id"]),
        created_at=row["created_at"],
        previous_secret_key_id=row["previous_secret_key_id"],
        previous_secret_ciphertext=row["previous_secret_ciphertext"],
        previous_secret_expires_at=row["previous_secret_expires_at"],
    )


def _delivery_values(rec: WebhookDeliveryRecord) -> dict[str, Any]:
    return {
        "id": rec.id,
        "endpoint_id": rec.endpoint_id,
        "event_id": rec.event_id,
        "elicitation_id": rec.elicitation_id,
        "body": rec.body,
        "status": rec.status.value,
        "attempts": rec.attempts,
        "next_attempt_at": rec.next_attempt_at,
        "claimed_by": rec.claimed_by,
        "lease_until": rec.lease_until,
        "last_attempt_at": rec.last_attempt_at,
        "last_status_code": rec.last_status_code,
        "last_error": rec.last_error,
        "created_at": rec.created_at,
        "delivered_at": rec.delivered_at,
    }


def _delivery(row: RowMapping) -> WebhookDeliveryRecord:
    return WebhookDeliveryRecord(
        id=row["id"],
        endpoint_id=row["endpoint_id"],
        event_id=int(row["event_id"]),
        elicitation_id=row["elicitation_id"],
        body=row["body"],
        status=DeliveryStatus(row["status"]),
        attempts=int(row["attempts"]),
        next_attempt_at=row["next_attempt_at"],
        claimed_by=row["claimed_by"],
        lease_until=row["lease_until"],
        last_attempt_at=row["last_attempt_at"],
        last_status_code=row["last_status_code"],
        last_error=row["last_error"],
        created_at=row["created_at"],
        delivered_at=row["delivered_at"],
    )
