"""What the operator console reads: keyset pages over grants, elicitations, the audit trail and webhook deliveries,
and the overview's counts. Every list is ordered by (time, id), newest first, and continues after a `Position`;
migration 0017 adds the indexes that make each page one index range scan, whatever its depth."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.errors import FlowRefused
from service.core.paging import Page, Position
from service.core.records import (
    AuditRecord,
    ElicitationRecord,
    GrantRecord,
    WebhookDeliveryRecord,
    WebhookEndpointRecord,
)
from service.core.states import ElicitationStatus

from .audit import _from_row as _audit
from .elicitation_rows import from_row as _elicitation
from .engine import Database
from .grant_rows import from_row as _grant
from .tables import api_elicitations, audit_events, elicitations, grants, webhook_deliveries, webhook_endpoints
from .webhooks import _delivery, _endpoint

OPEN_STATUSES = tuple(s.value for s in ElicitationStatus if not s.terminal)


@dataclass(frozen=True, slots=True)
class GrantFilter:
    subject: str | None = None
    issuer: str | None = None
    provider: str | None = None
    status: str | None = None  # "needs_user", "failing" (transient refresh failures) or None
    tenant: str | None = None  # the tenant the grant was made through


@dataclass(frozen=True, slots=True)
class AuditFilter:
    subject: str | None = None
    provider: str | None = None
    event: str | None = None
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive


@dataclass(frozen=True, slots=True)
class GrantCounts:
    """Grants by provider: how many, how many need the user (by reason), how many back off after failures."""

    total: dict[str, int]
    needs_user: dict[tuple[str, str], int]
    failing: int


def _after(time_col: Any, id_col: Any, position: Position | None, id_value: Any = None) -> ColumnElement[bool] | None:
    if position is None:
        return None
    return tuple_(time_col, id_col) < tuple_(position.at, position.id if id_value is None else id_value)


def _audit_id(position: Position | None) -> int | None:
    if position is None:
        return None
    if not position.id.isdigit() or len(position.id) > 18:
        raise FlowRefused("invalid_input", detail={"problem": "the paging cursor (after) cannot be read"})
    return int(position.id)


def _needs_user() -> ColumnElement[bool]:
    g = grants.c
    return and_(g.health_status == "needs_user", g.health_changed_at >= g.updated_at)


class ConsoleRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def _rows(self, statement: Select[Any], conn: AsyncConnection | None) -> Sequence[Any]:
        async with self._db.read(conn) as c:
            rows: Sequence[Any] = (await c.execute(statement)).mappings().all()
        return rows

    # -- grants -------------------------------------------------------------------------------------------
    async def grants(
        self, where: GrantFilter, *, after: Position | None, limit: int, conn: AsyncConnection | None = None
    ) -> Page[GrantRecord]:
        g = grants.c
        statement = select(grants).order_by(g.updated_at.desc(), g.id.desc()).limit(limit + 1)
        conditions = [
            _after(g.updated_at, g.id, after),
            g.identity_subject == where.subject if where.subject else None,
            g.identity_issuer == where.issuer if where.issuer else None,
            g.provider == where.provider if where.provider else None,
            g.tenant == where.tenant if where.tenant else None,
            _needs_user() if where.status == "needs_user" else None,
            g.refresh_failures.is_not(None) if where.status == "failing" else None,
        ]
        statement = statement.where(*(c for c in conditions if c is not None))
        rows = [_grant(row) for row in await self._rows(statement, conn)]
        return Page.of(rows, limit, lambda r: Position(r.updated_at, r.id))

    async def grant_counts(self, conn: AsyncConnection | None = None) -> GrantCounts:
        g = grants.c
        async with self._db.read(conn) as c:
            by_provider = select(g.provider, func.count()).group_by(g.provider)
            total: dict[Any, Any] = {p: n for p, n in (await c.execute(by_provider)).all()}
            needs = (
                await c.execute(
                    select(g.provider, g.health_reason, func.count())
                    .where(_needs_user())
                    .group_by(g.provider, g.health_reason)
                )
            ).all()
            failing = (await c.execute(select(func.count()).where(g.refresh_failures.is_not(None)))).scalar_one()
        return GrantCounts(
            {str(k): int(v) for k, v in total.items()},
            {(str(p), str(r or "-")): int(n) for p, r, n in needs},
            int(failing),
        )

    # -- elicitations ---------------------------------------------------------------------------------------
    async def elicitations(
        self,
        *,
        pending: bool,
        after: Position | None,
        limit: int,
        subject: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> Page[tuple[ElicitationRecord, str | None]]:
        """Elicitations newest first (only open ones with `pending`), each with its /v1 tenant (None: embedded)."""
        e = elicitations.c
        statement = (
            select(elicitations, api_elicitations.c.tenant)
            .outerjoin(api_elicitations, api_elicitations.c.elicitation_id == e.id)
            .order_by(e.created_at.desc(), e.id.desc())
            .limit(limit + 1)
        )
        conditions = [
            _after(e.created_at, e.id, after),
            e.status.in_(OPEN_STATUSES) if pending else None,
            e.identity_subject == subject if subject else None,
        ]
        statement = statement.where(*(c for c in conditions if c is not None))
        rows = [(_elicitation(row), row["tenant"]) for row in await self._rows(statement, conn)]
        return Page.of(rows, limit, lambda r: Position(r[0].created_at, r[0].id))

    # -- the audit trail ------------------------------------------------------------------------------------
    async def audit(
        self, where: AuditFilter, *, after: Position | None, limit: int, conn: AsyncConnection | None = None
    ) -> Page[AuditRecord]:
        a = audit_events.c
        statement = select(audit_events).order_by(a.at.desc(), a.id.desc()).limit(limit + 1)
        conditions = [
            _after(a.at, a.id, after, _audit_id(after)),
            a.identity_subject == where.subject if where.subject else None,
            a.provider == where.provider if where.provider else None,
            a.event == where.event if where.event else None,
            a.at >= where.since if where.since is not None else None,
            a.at < where.until if where.until is not None else None,
        ]
        statement = statement.where(*(c for c in conditions if c is not None))
        rows = [_audit(row) for row in await self._rows(statement, conn)]
        return Page.of(rows, limit, lambda r: Position(r.at, str(r.id)))

    # -- webhook endpoints and deliveries ---------------------------------------------------------------
    async def endpoints(
        self, *, after: Position | None, limit: int, tenant: str | None = None, conn: AsyncConnection | None = None
    ) -> Page[WebhookEndpointRecord]:
        w = webhook_endpoints.c
        statement = select(webhook_endpoints).order_by(w.created_at.desc(), w.id.desc()).limit(limit + 1)
        conditions = [_after(w.created_at, w.id, after), w.tenant == tenant if tenant else None]
        statement = statement.where(*(c for c in conditions if c is not None))
        rows = [_endpoint(row) for row in await self._rows(statement, conn)]
        return Page.of(rows, limit, lambda r: Position(r.created_at, r.id))

    # -- webhook deliveries ---------------------------------------------------------------------------------
    async def deliveries(
        self,
        endpoint_id: str | None,
        *,
        after: Position | None,
        limit: int,
        waiting: bool = False,
        conn: AsyncConnection | None = None,
    ) -> Page[WebhookDeliveryRecord]:
        d = webhook_deliveries.c
        statement = select(webhook_deliveries).order_by(d.created_at.desc(), d.id.desc()).limit(limit + 1)
        conditions = [
            _after(d.created_at, d.id, after),
            d.endpoint_id == endpoint_id if endpoint_id else None,
            or_(d.status == "pending", d.status == "delivering") if waiting else None,
        ]
        statement = statement.where(*(c for c in conditions if c is not None))
        rows = [_delivery(row) for row in await self._rows(statement, conn)]
        return Page.of(rows, limit, lambda r: Position(r.created_at, r.id))
