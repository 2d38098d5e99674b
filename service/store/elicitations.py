"""Elicitation rows: insert, read, and status changes that follow `service.states.ALLOWED` atomically."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, cast

from sqlalchemy import bindparam, exists, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.accounts import AccountAsk
from service.core.identity import Identity
from service.core.records import AuditEntry, ElicitationRecord, ScopeKind
from service.core.states import ALLOWED, CompletionDelivery, ElicitationStatus

from .audit import audit_params, audit_row, fuses_audit, with_audit_row, write_audit_row
from .engine import Database, dump_json, load_json
from .tables import COMPLETION_PENDING, elicitations, replicas

# The statements every flow runs, built once (building and keying a statement costs more than running it).
_INSERT = insert(elicitations)
_GET = select(elicitations).where(elicitations.c.id == bindparam("elicitation_id"))
_TRANSITION = (
    update(elicitations)
    .where(
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.status.in_(bindparam("from_statuses", expanding=True)),
    )
    .values(status=bindparam("new_status"), updated_at=bindparam("now"))
    .returning(*elicitations.c)
)
_TRANSITION_WITH_REASON = _TRANSITION.values(failure_reason=bindparam("reason"))
_CLAIM_COMPLETION = (
    update(elicitations)
    .where(
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.status == ElicitationStatus.COMPLETED.value,
        elicitations.c.replica_id == bindparam("claiming_replica"),
        elicitations.c.completion_delivery.is_(None),
    )
    .values(completion_delivery=CompletionDelivery.DELIVERING.value)
    .returning(elicitations.c.updated_at)
)
_SETTLE_COMPLETION = (
    update(elicitations)
    .where(
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.completion_delivery == CompletionDelivery.DELIVERING.value,
    )
    .values(completion_delivery=bindparam("outcome"))
)


# The same with the step's audit row in the statement (PostgreSQL: a data-modifying CTE, `with_audit_row`).
# Every column `_to_row` gives (the two left out start NULL or 0 and change later): a column added to the table
# without a value there makes this insert fail loudly rather than store NULL.
_ROW_COLUMNS = [c.name for c in elicitations.c if c.name not in ("identity_mismatches", "completion_delivery")]
_AUDITED = {
    "insert": with_audit_row(
        insert(elicitations).values({n: bindparam(n) for n in _ROW_COLUMNS}).returning(elicitations.c.id)
    ),
    "transition": with_audit_row(_TRANSITION),
    "transition_with_reason": with_audit_row(_TRANSITION_WITH_REASON),
    "settle": with_audit_row(_SETTLE_COMPLETION.returning(elicitations.c.id)),
}


def predecessors(target: ElicitationStatus) -> frozenset[ElicitationStatus]:
    """The statuses from which `target` may be reached. Terminal statuses are never among them."""
    return frozenset(current for current, allowed in ALLOWED.items() if target in allowed)


class ElicitationRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(
        self, rec: ElicitationRecord, conn: AsyncConnection | None = None, *, audit: AuditEntry | None = None
    ) -> None:
        """Insert the elicitation, and `audit`'s row with it (in its statement on PostgreSQL)."""
        async with self._db.write(conn) as c:
            if audit is not None and fuses_audit(c):
                values = audit_row(audit)
                await c.execute(_AUDITED["insert"], {**_to_row(rec), **audit_params(values)})
                await write_audit_row(c, values, written=True)
                return
            await c.execute(_INSERT, _to_row(rec))
            if audit is not None:
                await write_audit_row(c, audit_row(audit))

    async def get(self, id: str, conn: AsyncConnection | None = None) -> ElicitationRecord | None:
        async with self._db.read(conn) as c:
            row = (await c.execute(_GET, {"elicitation_id": id})).mappings().first()
        return None if row is None else _from_row(row)

    async def transition(
        self,
        id: str,
        target: ElicitationStatus,
        *,
        reason: str | None = None,
        now: datetime,
        from_: Collection[ElicitationStatus] | None = None,
        conn: AsyncConnection | None = None,
        audit: AuditEntry | None = None,
    ) -> ElicitationRecord | None:
        """Move the elicitation to `target` if its current status allows it, in one UPDATE.

        Returns the updated record, or None when the id is unknown or the current status does not allow
        `target` (a terminal status never changes). `reason` is stored as the failure reason when given.
        `from_` narrows the statuses it may move from (the core passes it for a step it checked as a path).
        `audit` is written when the move happens, in the same transaction (on PostgreSQL in the UPDATE's statement).
        """
        allowed = predecessors(target) if from_ is None else frozenset(from_)
        assert not any(s.terminal for s in allowed), "a terminal status never changes"
        params = {
            "elicitation_id": id,
            "from_statuses": sorted(s.value for s in allowed),
            "new_status": target.value,
            "now": now,
        }
        if reason is not None:
            params["reason"] = reason
        async with self._db.write(conn) as c:
            values = None if audit is None else audit_row(audit)
            fused = values is not None and fuses_audit(c)
            if fused:
                assert values is not None
                params.update(audit_params(values))
                statement = _AUDITED["transition" if reason is None else "transition_with_reason"]
            else:
                statement = _TRANSITION if reason is None else _TRANSITION_WITH_REASON
            row = (await c.execute(statement, params)).mappings().first()
            if row is not None and values is not None:
                await write_audit_row(c, values, written=fused)
        return None if row is None else _from_row(row)

    async def add_identity_mismatch(self, id: str, *, now: datetime, conn: AsyncConnection | None = None) -> int:
        """Count one identity mismatch on the elicitation, atomically; return the new count (0 if unknown)."""
        statement = (
            update(elicitations)
            .where(elicitations.c.id == id)
            .values(identity_mismatches=elicitations.c.identity_mismatches + 1, updated_at=now)
            .returning(elicitations.c.identity_mismatches)
        )
        async with self._db.write(conn) as c:
            count = (await c.execute(statement)).scalar()
        return int(count or 0)

    # -- telling the client that it completed: exactly once, decided here ---------------------------------------
    async def claim_completion(self, id: str, replica_id: str, conn: AsyncConnection | None = None) -> datetime | None:
        """Take the telling of `id`'s completion for `replica_id` (the replica holding its connection) unless it
        was taken or settled already: one conditional UPDATE. The completion time when taken, else None."""
        params = {"elicitation_id": id, "claiming_replica": replica_id}
        async with self._db.write_alone(conn) as c:  # on the completion's path: no BEGIN/COMMIT round trips
            completed_at: datetime | None = (await c.execute(_CLAIM_COMPLETION, params)).scalar()
        return completed_at

    async def settle_completion(
        self,
        id: str,
        outcome: CompletionDelivery,
        conn: AsyncConnection | None = None,
        *,
        audit: AuditEntry | None = None,
    ) -> bool:
        """Record how a claimed telling ended (`sent` or `undeliverable`), with `audit`'s row when it is recorded
        (in its statement on PostgreSQL); False if it was settled meanwhile."""
        params: dict[str, Any] = {"elicitation_id": id, "outcome": outcome.value}
        async with self._db.write(conn) as c:
            values = None if audit is None else audit_row(audit)
            if values is not None and fuses_audit(c):
                settled = (await c.execute(_AUDITED["settle"], {**params, **audit_params(values)})).first() is not None
                if settled:
                    await write_audit_row(c, values, written=True)
                return settled
            settled = (await c.execute(_SETTLE_COMPLETION, params)).rowcount > 0
            if settled and values is not None:
                await write_audit_row(c, values)
            return settled

    async def completions_to_tell(
        self, replica_id: str, *, limit: int = 100, conn: AsyncConnection | None = None
    ) -> list[ElicitationRecord]:
        """Completed elicitations of `replica_id` that nobody started to tell (a catch-up after a missed event)."""
        statement = (
            select(elicitations)
            .where(
                text(COMPLETION_PENDING),
                elicitations.c.replica_id == replica_id,
                elicitations.c.completion_delivery.is_(None),
            )
            .limit(limit)
        )
        async with self._db.read(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return [_from_row(row) for row in rows]

    async def abandon_completions(
        self, *, live_since: datetime, limit: int = 100, conn: AsyncConnection | None = None
    ) -> list[ElicitationRecord]:
        """Settle as undeliverable the completions whose replica is gone (no heartbeat since `live_since`): the
        connection they were to be told on went with it. The rows so settled."""
        alive = exists().where(replicas.c.id == elicitations.c.replica_id, replicas.c.heartbeat_at >= live_since)
        orphans = select(elicitations.c.id).where(text(COMPLETION_PENDING), ~alive).limit(limit).scalar_subquery()
        statement = (
            update(elicitations)
            .where(elicitations.c.id.in_(orphans), text(COMPLETION_PENDING))
            .values(completion_delivery=CompletionDelivery.UNDELIVERABLE.value)
            .returning(*elicitations.c)
        )
        async with self._db.write(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return [_from_row(row) for row in rows]

    async def count_open(self, conn: AsyncConnection | None = None) -> dict[ElicitationStatus, int]:
        """How many elicitations are in each open (not terminal) status; every open status is present."""
        open_statuses = [s for s in ElicitationStatus if not s.terminal]
        statement = (
            select(elicitations.c.status, func.count())
            .where(elicitations.c.status.in_([s.value for s in open_statuses]))
            .group_by(elicitations.c.status)
        )
        async with self._db.read(conn) as c:
            counts = {ElicitationStatus(status): int(n) for status, n in (await c.execute(statement)).all()}
        return {status: counts.get(status, 0) for status in open_statuses}

    async def expire_due(
        self, now: datetime, *, limit: int = 500, reason: str | None = None, conn: AsyncConnection | None = None
    ) -> list[ElicitationRecord]:
        """Mark up to `limit` open elicitations with `expires_at` at or before `now` as EXPIRED, soonest due first.

        Returns the expired records. Of two concurrent callers each elicitation is expired by exactly one (the
        status condition is checked again on the row being updated).
        """
        open_statuses = sorted(s.value for s in predecessors(ElicitationStatus.EXPIRED))
        due = (
            select(elicitations.c.id)
            .where(elicitations.c.status.in_(open_statuses), elicitations.c.expires_at <= now)
            .order_by(elicitations.c.expires_at)
            .limit(limit)
        )
        values: dict[str, Any] = {"status": ElicitationStatus.EXPIRED.value, "updated_at": now}
        if reason is not None:
            values["failure_reason"] = reason
        statement = (
            update(elicitations)
            .where(elicitations.c.id.in_(due.scalar_subquery()), elicitations.c.status.in_(open_statuses))
            .values(values)
            .returning(*elicitations.c)
        )
        async with self._db.write(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return sorted((_from_row(row) for row in rows), key=lambda r: r.id)


def _to_row(rec: ElicitationRecord) -> dict[str, Any]:
    return {
        "id": rec.id,
        "connection_key": rec.connection_key,
        "identity_issuer": rec.identity.issuer,
        "identity_subject": rec.identity.subject,
        "provider": rec.provider,
        "scopes": dump_json(list(rec.scopes)),
        "scope_kind": rec.scope_kind,
        "session_id": rec.session_id,
        "tool_call_id": rec.tool_call_id,
        "request_id": None if rec.request_id is None else dump_json(rec.request_id),
        "agent_name": rec.agent_name,
        "message": rec.message,
        "status": rec.status.value,
        "failure_reason": rec.failure_reason,
        "created_at": rec.created_at,
        "expires_at": rec.expires_at,
        "updated_at": rec.updated_at,
        "replica_id": rec.replica_id,
        "connection_values": dump_json(dict(rec.connection_values)) if rec.connection_values else None,
        "account": dump_json(rec.account.to_json()) if rec.account is not None else None,
    }


def from_row(row: Mapping[Any, Any]) -> ElicitationRecord:
    """The record of an elicitations row (also for a row joined by another repository)."""
    return _from_row(row)


def _from_row(row: Mapping[Any, Any]) -> ElicitationRecord:
    return ElicitationRecord(
        id=row["id"],
        connection_key=row["connection_key"],
        identity=Identity(row["identity_issuer"], row["identity_subject"]),
        provider=row["provider"],
        scopes=tuple(load_json(row["scopes"])),
        scope_kind=cast(ScopeKind, row["scope_kind"]),
        session_id=row["session_id"],
        tool_call_id=row["tool_call_id"],
        request_id=None if row["request_id"] is None else load_json(row["request_id"]),
        agent_name=row["agent_name"],
        message=row["message"],
        status=ElicitationStatus(row["status"]),
        failure_reason=row["failure_reason"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        updated_at=row["updated_at"],
        replica_id=row["replica_id"],
        connection_values=load_json(row["connection_values"]) if row.get("connection_values") else {},
        account=AccountAsk.from_json(load_json(row["account"])) if row.get("account") else None,
    )
