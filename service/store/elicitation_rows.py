"""An elicitation's row and its record: what is written, what is read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from service.core.accounts import AccountAsk
from service.core.identity import Identity
from service.core.records import ElicitationRecord, ScopeKind
from service.core.states import ElicitationStatus

from .engine import dump_json, load_json
from .tables import elicitations

# The columns a record is read from: every one but `step_note` and `step_blob`, which SQLite's steps write and nothing
# reads.
elicitation_columns = tuple(c for c in elicitations.c if c.name not in ("step_note", "step_blob"))


def to_row(rec: ElicitationRecord) -> dict[str, Any]:
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
