"""Elicitation rows: insert, read, and status changes that follow `service.states.ALLOWED` atomically."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.events import ElicitationEvent
from service.core.records import AuditEntry, ElicitationRecord, FlowRecord, GrantRecord
from service.core.states import ALLOWED, CompletionDelivery, ElicitationStatus

from .audit import audit_row, log_audit_event, write_audit_row
from .elicitation_rows import elicitation_columns
from .elicitation_rows import from_row as _from_row
from .elicitation_rows import to_row as _to_row
from .elicitation_sql import CLAIM_COMPLETION, GET, INSERT_FLOW, RELEASE_TELLING
from .engine import Database, commit_with_rows
from .flow_rows import flow_row
from .grants import GrantRepository
from .outbox import OutboxRepository
from .step_writes import Carried, step_writes
from .tables import COMPLETION_PENDING, elicitations, replicas


def _carries_all(carried: Carried, values: Any, flow: FlowRecord | None, ending: ElicitationEvent | None) -> bool:
    """Whether a transition's statement writes every row that goes with it (nothing for `_write_beside` to write)."""
    return (values is None or carried.audit) and (flow is None or carried.flow) and (ending is None or carried.ending)


def predecessors(target: ElicitationStatus) -> frozenset[ElicitationStatus]:
    """The statuses from which `target` may be reached. Terminal statuses are never among them."""
    return frozenset(current for current, allowed in ALLOWED.items() if target in allowed)


class ElicitationRepository:
    def __init__(self, db: Database, outbox: OutboxRepository, grants: GrantRepository) -> None:
        self._db = db
        self._outbox = outbox  # where `end` logs an ending
        self._grants = grants  # where `end_with_first_grant` inserts a grant its ending did not
        self._steps = step_writes(db.writer.dialect)  # how a step's statement writes its audit row and the others

    async def insert(
        self, rec: ElicitationRecord, conn: AsyncConnection | None = None, *, audit: AuditEntry | None = None
    ) -> None:
        """Insert the elicitation, and `audit`'s row with it (in its statement)."""
        values = None if audit is None else audit_row(audit)
        statement, params = self._steps.insert(_to_row(rec), values)
        async with self._db.write(conn) as c:
            await c.execute(statement, params)
            if values is not None:
                await write_audit_row(c, values, written=True)  # its log line

    async def get(self, id: str, conn: AsyncConnection | None = None) -> ElicitationRecord | None:
        async with self._db.read(conn) as c:
            row = (await c.execute(GET, {"elicitation_id": id})).mappings().first()
        return None if row is None else _from_row(row)

    async def get_audited(self, id: str, audit: AuditEntry, *, now: datetime) -> tuple[ElicitationRecord, bool] | None:
        """The elicitation (as `get`) and whether `audit` about it (its id, identity and provider taken from the row)
        was written with the read, in its statement: when the elicitation is open and not expired at `now` (and its
        identity needs no escaping, `audit_row`). When it was not, the caller writes it if it should."""
        statement, params = self._steps.opened(id, now, audit_row(audit))
        async with self._db.write_alone() as c:
            row = (await c.execute(statement, params)).mappings().first()
            if row is None and not self._steps.opening_reads:  # nothing opened: the plain read
                row = (await c.execute(GET, {"elicitation_id": id})).mappings().first()
        if row is None:
            return None
        record = _from_row(row)
        audited = bool(row.get("audited", False))
        if audited:  # its log line, once committed
            log_audit_event(
                audit_row(replace(audit, elicitation_id=id, identity=record.identity, provider=record.provider))
            )
        return record, audited

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
        take_telling: bool = False,
        flow: FlowRecord | None = None,
        last: bool = False,
    ) -> ElicitationRecord | None:
        """Move the elicitation to `target` if its current status allows it, in one UPDATE.

        Returns the updated record, or None when the id is unknown or the current status does not allow
        `target` (a terminal status never changes). `reason` is stored as the failure reason when given.
        `from_` narrows the statuses it may move from (the core passes it for a step it checked as a path).
        `audit` is written when the move happens, by the UPDATE's statement (`step_writes`).
        `take_telling` (a completion, without `reason`): the telling of the completion is taken in the same UPDATE, as
        `claim_completion` would take it, for the replica that completes it and holds its connection.
        `flow` (with `audit`): the OAuth flow the move starts, inserted when the move happens, by the UPDATE's
        statement.
        `last`: as `end`'s.
        """
        moved = await self._move(id, target, reason, now, from_, conn, audit, take_telling, flow, None, last=last)
        return None if moved is None else moved[0]

    async def end(
        self,
        id: str,
        target: ElicitationStatus,
        ending: ElicitationEvent,
        *,
        reason: str | None = None,
        now: datetime,
        conn: AsyncConnection,
        audit: AuditEntry,
        take_telling: bool = False,
        last: bool = False,
    ) -> tuple[ElicitationRecord, ElicitationEvent] | None:
        """`transition` to a terminal `target` with its audit row, and `ending` appended to the event log when it
        happens, all by one statement (on PostgreSQL it must be the transaction's last: `outbox.append`). The
        ended record and the event as logged; None when the status did not allow it (nothing written).
        `last`: the caller writes nothing more in `conn`'s transaction when it ends the elicitation, so on SQLite the
        statement may commit it in its own trip (`commit_with_rows`)."""
        moved = await self._move(id, target, reason, now, None, conn, audit, take_telling, None, ending, last=last)
        if moved is None:
            return None
        record, logged = moved
        assert logged is not None
        return record, logged

    async def end_with_first_grant(
        self,
        id: str,
        target: ElicitationStatus,
        ending: ElicitationEvent,
        grant: GrantRecord,
        *,
        now: datetime,
        conn: AsyncConnection,
        audit: AuditEntry,
        take_telling: bool = False,
        last: bool = False,
    ) -> tuple[bool, tuple[ElicitationRecord, ElicitationEvent] | None]:
        """`grant`, a user's first at its provider, inserted unless its account holds one by now
        (`GrantRepository.insert_new`), and only when it went in, `end`: in one statement. Whether the grant went in,
        and what `end` returned. `last`: as `end`'s."""
        if not self._steps.carries(grant):  # its own statement first, the ending only when it went in
            if await self._grants.insert_new(grant, conn) is None:
                return False, None
            return True, await self.end(
                id, target, ending, now=now, conn=conn, audit=audit, take_telling=take_telling, last=last
            )
        moved = await self._move(id, target, None, now, None, conn, audit, take_telling, None, ending, grant, last=last)
        if moved is None:  # the grant goes in though the status did not allow the ending (a cancellation)
            if self._steps.grant_without_ending:  # it did, unless its account held one
                return await self._grants.get(grant.id, conn) is not None, None
            return await self._grants.insert_new(grant, conn) is not None, None
        record, logged = moved
        assert logged is not None
        return True, (record, logged)

    async def _move(
        self,
        id: str,
        target: ElicitationStatus,
        reason: str | None,
        now: datetime,
        from_: Collection[ElicitationStatus] | None,
        conn: AsyncConnection | None,
        audit: AuditEntry | None,
        take_telling: bool,
        flow: FlowRecord | None,
        ending: ElicitationEvent | None,
        grant: GrantRecord | None = None,
        *,
        last: bool = False,
    ) -> tuple[ElicitationRecord, ElicitationEvent | None] | None:
        assert not take_telling or (target is ElicitationStatus.COMPLETED and reason is None)
        assert (flow is None and ending is None) or audit is not None
        allowed = predecessors(target) if from_ is None else frozenset(from_)
        assert not any(s.terminal for s in allowed), "a terminal status never changes"
        params: dict[str, Any] = {
            "elicitation_id": id,
            "from_statuses": sorted(s.value for s in allowed),
            "new_status": target.value,
            "now": now,
        }
        if reason is not None:
            params["reason"] = reason
        values = None if audit is None else audit_row(audit)
        (statement, more), carried = self._steps.transition(
            reason=reason is not None,
            taking=take_telling,
            audit=values,
            flow=flow,
            ending=None if ending is None else self._outbox.event_row(ending, now),
            grant=grant,
        )
        async with self._db.write(conn) as c:
            if last and conn is not None and _carries_all(carried, values, flow, ending):
                commit_with_rows(c)  # moved: nothing is left to write in the caller's transaction
            row = (await c.execute(statement, {**params, **more})).mappings().first()
            if row is None:
                return None
            logged = await self._write_beside(c, row, values, carried, flow, ending, now)
        return _from_row(row), logged

    async def _write_beside(
        self,
        c: AsyncConnection,
        row: Any,
        values: dict[str, Any] | None,
        carried: Carried,
        flow: FlowRecord | None,
        ending: ElicitationEvent | None,
        now: datetime,
    ) -> ElicitationEvent | None:
        """After the transition: the rows its statement did not write (`carried`), the audit row's log line, and the
        logged `ending`."""
        if values is not None:
            await write_audit_row(c, values, written=carried.audit)
        if flow is not None and not carried.flow:
            await c.execute(INSERT_FLOW, flow_row(flow))
        if ending is None:
            return None
        if carried.ending:
            return self._outbox.logged(ending, row["logged_event_id"], now)
        (logged,) = await self._outbox.append([ending], at=now, conn=c)
        return logged

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
            completed_at: datetime | None = (await c.execute(CLAIM_COMPLETION, params)).scalar()
        return completed_at

    async def release_telling(self, id: str, conn: AsyncConnection | None = None) -> bool:
        """Give back a telling taken with the completion (`take_telling`) that this process did not start: the
        completion is untold again, for the catch-up to tell. False if it was not held."""
        async with self._db.write(conn) as c:
            return (await c.execute(RELEASE_TELLING, {"elicitation_id": id})).rowcount > 0

    async def settle_completion(
        self,
        id: str,
        outcome: CompletionDelivery,
        conn: AsyncConnection | None = None,
        *,
        audit: AuditEntry | None = None,
    ) -> bool:
        """Record how a claimed telling ended (`sent` or `undeliverable`), with `audit`'s row when it is recorded
        (by its statement, which is its transaction without `conn`); False if it was settled meanwhile."""
        values = None if audit is None else audit_row(audit)
        statement, more = self._steps.settle(values)
        params = {"elicitation_id": id, "outcome": outcome.value, **more}
        async with self._db.write_alone(conn) as c:
            settled = (await c.execute(statement, params)).first() is not None
            if settled and values is not None:
                await write_audit_row(c, values, written=True)  # its log line
            return settled

    async def completions_to_tell(
        self, replica_id: str, *, limit: int = 100, conn: AsyncConnection | None = None
    ) -> list[ElicitationRecord]:
        """Completed elicitations of `replica_id` that nobody started to tell (a catch-up after a missed event)."""
        statement = (
            select(*elicitation_columns)
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
            .returning(*elicitation_columns)
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
            .returning(*elicitation_columns)
        )
        async with self._db.write(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return sorted((_from_row(row) for row in rows), key=lambda r: r.id)
