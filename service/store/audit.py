"""The audit trail: append-only events about elicitations and grants, never holding secrets.

Each event is a row in `audit_events` and one structured log line on the `service.audit` logger (fields
`audit_event`, `elicitation_id`, `provider`, `identity_issuer`, `identity_subject`, `detail`). An event written
inside a `Store.transaction()` is logged once that transaction commits, so the log never shows an event the
database rolled back. Detail keys that name secrets are replaced by "[redacted]" in both places.

Every field is bounded, whatever a caller passes (a provider name from a URL, a subject from a header): control
characters are written as escapes (`\\x00`), and a value too long for its column ends in TRUNCATED; strings in
`detail` are held to MAX_DETAIL_STRING characters the same way. No input can overflow a column or carry a NUL
into PostgreSQL.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import RowMapping, Table, bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.audit_events import checked_event
from service.core.identity import Identity
from service.core.records import AuditEntry, AuditRecord, ElicitationRecord
from service.util.text import CONTROL_CHARACTER

from .engine import Database, dump_json, load_json
from .tables import audit_events

log = logging.getLogger("service.audit")

# conn.info key under which a Store.transaction() collects events to log after its commit.
PENDING_AUDIT_LOG = "connector_pending_audit_log"

# Never stored or logged as audit detail, whoever passes them.
SECRET_DETAIL_KEYS = frozenset(
    {
        "access_token",
        "refresh_token",
        "id_token",
        "token",
        "code",
        "code_verifier",
        "verifier",
        "client_secret",
        "secret",
        "password",
        "api_key",
        "key",
        "state",
        "nonce",
        "cookie",
        "authorization",
    }
)


TRUNCATED = "…[truncated]"
MAX_DETAIL_STRING = 512


def bounded(value: str, limit: int) -> str:
    """`value` with control characters escaped, cut to at most `limit` characters ending in TRUNCATED."""
    escaped = CONTROL_CHARACTER.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}", value
    )
    if len(escaped) <= limit:
        return escaped
    return escaped[: max(0, limit - len(TRUNCATED))] + TRUNCATED


def _column_limit(name: str) -> int:
    length = getattr(audit_events.c[name].type, "length", None)
    assert isinstance(length, int)
    return length


_LIMITS = {
    name: _column_limit(name) for name in ("event", "elicitation_id", "identity_issuer", "identity_subject", "provider")
}


def _bounded_field(name: str, value: str | None) -> str | None:
    return None if value is None else bounded(value, _LIMITS[name])


def _bounded_detail(value: Any) -> Any:
    if isinstance(value, str):
        return bounded(value, MAX_DETAIL_STRING)
    if isinstance(value, Mapping):
        return {bounded(str(k), 64): _bounded_detail(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_bounded_detail(v) for v in value]
    return value


def _redact(detail: Mapping[str, Any]) -> dict[str, Any]:
    return {k: "[redacted]" if k.lower() in SECRET_DETAIL_KEYS else v for k, v in detail.items()}


def log_audit_event(values: Mapping[str, Any]) -> None:
    """The log line of one stored audit event (`values` as inserted, detail already JSON)."""
    log.info(
        "audit %s",
        values["event"],
        extra={
            "audit_event": values["event"],
            "elicitation_id": values["elicitation_id"],
            "provider": values["provider"],
            "identity_issuer": values["identity_issuer"],
            "identity_subject": values["identity_subject"],
            "detail": load_json(values["detail"]),
        },
    )


_INSERT = insert(audit_events)  # built once: every step of every flow appends a row
_COLUMNS = ("at", "event", "elicitation_id", "identity_issuer", "identity_subject", "provider", "detail")


def audit_row(entry: AuditEntry) -> dict[str, Any]:
    """The row of `entry` as stored (every field bounded, secret-named detail keys redacted)."""
    identity = entry.identity
    return {
        "at": entry.at,
        "event": _bounded_field("event", checked_event(entry.event)),
        "elicitation_id": _bounded_field("elicitation_id", entry.elicitation_id),
        "identity_issuer": _bounded_field("identity_issuer", None if identity is None else identity.issuer),
        "identity_subject": _bounded_field("identity_subject", None if identity is None else identity.subject),
        "provider": _bounded_field("provider", entry.provider),
        "detail": dump_json(_bounded_detail(_redact(entry.detail or {}))),
    }


def with_audit_row(statement: Any, beside: Table | None = None) -> Any:
    """PostgreSQL: `statement` (an INSERT, UPDATE or DELETE ... RETURNING) and, for each row it changed, the audit
    row given as `audit_*` parameters (`audit_params`), in one statement: a data-modifying CTE. Its rows are the
    changed rows. `beside`: a table that also gets one row for each changed row (`rows_beside`)."""
    changed = statement.cte("changed")
    combined = select(*changed.c).add_cte(audit_insert_of(changed))
    return combined if beside is None else combined.add_cte(rows_beside(changed, beside))


def audit_insert_of(changed: Any) -> Any:
    """PostgreSQL: a CTE inserting the audit row of `audit_*` parameters for each row of the CTE `changed`."""
    row = select(*(bindparam(f"audit_{n}", type_=audit_events.c[n].type) for n in _COLUMNS)).select_from(changed)
    return insert(audit_events).from_select(list(_COLUMNS), row).cte("audited")


def rows_beside(changed: Any, table: Table) -> Any:
    """PostgreSQL: a CTE inserting into `table`, for each row of the CTE `changed`, the row given by parameters named
    after its columns, prefixed with the table's name (`oauth_flows_id`, ...): a row that belongs with the change."""
    given = select(*(bindparam(f"{table.name}_{c.name}", type_=c.type) for c in table.c)).select_from(changed)
    return insert(table).from_select([c.name for c in table.c], given).cte(f"{table.name}_beside")


def audit_params(values: Mapping[str, Any]) -> dict[str, Any]:
    """An audit row's values as the parameters of a statement built by `with_audit_row`."""
    return {f"audit_{name}": values[name] for name in _COLUMNS}


async def write_audit_row(conn: AsyncConnection, values: Mapping[str, Any], *, written: bool = False) -> None:
    """Append an audit row in `conn`'s transaction (unless `written` by the change's own statement already), and log
    it: after the commit inside a `Store.transaction()`, else at once."""
    if not written:
        await conn.execute(_INSERT, dict(values))
    pending = conn.info.get(PENDING_AUDIT_LOG)
    if isinstance(pending, builtins.list):
        pending.append(values)  # logged by Store.transaction() after the commit
    else:
        log_audit_event(values)


class AuditRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

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
        """Append one event and log it. `detail` must be JSON-serialisable; secret-named keys are redacted."""
        at = now if now is not None else datetime.now(UTC)
        values = audit_row(AuditEntry(event, at, elicitation_id, identity, provider, detail))
        async with self._db.write(conn) as c:
            await c.execute(_INSERT, values)
        pending = conn.info.get(PENDING_AUDIT_LOG) if conn is not None else None
        if isinstance(pending, builtins.list):
            pending.append(values)  # logged by Store.transaction() after the commit
        else:
            log_audit_event(values)

    async def record_many(
        self,
        event: str,
        records: Sequence[ElicitationRecord],
        *,
        detail: Mapping[str, Any] | None = None,
        now: datetime,
        conn: AsyncConnection,
    ) -> None:
        """Append the same event about each of `records` (one statement), in the caller's transaction."""
        if not records:
            return
        text = dump_json(_redact(detail or {}))
        checked_event(event)
        rows = [
            {
                "at": now,
                "event": event,
                "elicitation_id": rec.id,
                "identity_issuer": rec.identity.issuer,
                "identity_subject": rec.identity.subject,
                "provider": rec.provider,
                "detail": text,
            }
            for rec in records
        ]
        await conn.execute(_INSERT, rows)
        pending = conn.info.get(PENDING_AUDIT_LOG)
        for values in rows:
            if isinstance(pending, builtins.list):
                pending.append(values)
            else:
                log_audit_event(values)

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
        async with self._db.read(conn) as c:
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
