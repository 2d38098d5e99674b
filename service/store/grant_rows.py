"""A grant's row and its record: what is written, what is read (its health, its account)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import RowMapping

from service.core.health import GrantHealth, GrantStatus, known_reason
from service.core.identity import Identity
from service.core.records import GrantRecord

from .engine import dump_json, load_json


def to_row(rec: GrantRecord) -> dict[str, Any]:
    return {
        "id": rec.id,
        "identity_issuer": rec.identity.issuer,
        "identity_subject": rec.identity.subject,
        "provider": rec.provider,
        "provider_account_id": rec.provider_account_id,
        "scopes": dump_json(list(rec.scopes)),
        "refused_scopes": dump_json(list(rec.refused_scopes)) if rec.refused_scopes else None,
        "token_key_id": rec.token_key_id,
        "token_ciphertext": rec.token_ciphertext,
        "token_expires_at": rec.token_expires_at,
        "created_at": rec.created_at,
        "updated_at": rec.updated_at,
        "health_status": None if rec.health.status is GrantStatus.ACTIVE else rec.health.status.value,
        "health_reason": rec.health.reason.value if rec.health.reason is not None else None,
        "health_changed_at": rec.health.changed_at,
        "last_refresh_at": rec.health.last_refresh_at,
        "last_failure_at": rec.health.last_failure_at,
        "next_refresh_at": rec.health.next_attempt_at,
        "refresh_failures": rec.health.failures or None,
        "tenant": rec.tenant,
        "account_label": rec.account_label,
        "account_name": rec.account_name,
    }


def _health(row: RowMapping) -> GrantHealth:
    changed_at = row["health_changed_at"]
    status = GrantStatus.ACTIVE
    # `needs_user` holds for the tokens it was marked on: stored anew since (by any release), the grant is active.
    if row["health_status"] == GrantStatus.NEEDS_USER and changed_at is not None and changed_at >= row["updated_at"]:
        status = GrantStatus.NEEDS_USER
    reason = row["health_reason"] if status is GrantStatus.NEEDS_USER else None
    return GrantHealth(
        status=status,
        reason=known_reason(reason),
        changed_at=changed_at if status is GrantStatus.NEEDS_USER else None,
        last_refresh_at=row["last_refresh_at"],
        last_failure_at=row["last_failure_at"],
        next_attempt_at=row["next_refresh_at"],
        failures=row["refresh_failures"] or 0,
    )


def from_row(row: RowMapping) -> GrantRecord:
    return GrantRecord(
        id=row["id"],
        identity=Identity(row["identity_issuer"], row["identity_subject"]),
        provider=row["provider"],
        provider_account_id=row["provider_account_id"],
        scopes=tuple(load_json(row["scopes"])),
        refused_scopes=tuple(load_json(row["refused_scopes"])) if row["refused_scopes"] else (),
        token_key_id=row["token_key_id"],
        token_ciphertext=bytes(row["token_ciphertext"]),
        token_expires_at=row["token_expires_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        health=_health(row),
        tenant=row["tenant"],
        account_label=row["account_label"],
        account_name=row["account_name"],
    )
