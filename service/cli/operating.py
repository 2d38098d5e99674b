"""What the operator commands (`grants`, `elicitations`, `audit`) share: the console's operations on a connector
built from the settings (`service.console`, as the `/admin` pages use them), the CLI's operator for the audit
trail, and the JSON form of each record (`--json`: one object, `{"items": [...], "next": cursor-or-null}`).

Never a token, a ciphertext or a secret in any of it."""

from __future__ import annotations

import getpass
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from .framework import Invocation

if TYPE_CHECKING:
    from ..console import Console, Operator
    from ..core.paging import Page
    from ..core.records import AuditRecord, ElicitationRecord, GrantRecord

T = TypeVar("T")


def cli_operator() -> Operator:
    from ..console import Operator

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return Operator(f"cli:{user}", "cli")


def with_console(invocation: Invocation, work: Callable[[Console], Awaitable[T]]) -> T:
    """Run `work` on the console of a connector built from the settings (schema checked first; nothing started)."""
    import asyncio

    from ..app import build_runtime

    settings = invocation.settings()

    async def run() -> T:
        runtime = build_runtime(settings)
        try:
            await runtime.store.check_schema()
            return await work(runtime.console)
        finally:
            await runtime.close()

    return asyncio.run(run())


def when(at: datetime | None) -> str | None:
    return None if at is None else at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def grant_json(grant: GrantRecord, now: datetime) -> dict[str, Any]:
    status, reason = grant.status_at(now)
    return {
        "id": grant.id,
        "issuer": grant.identity.issuer,
        "subject": grant.identity.subject,
        "provider": grant.provider,
        "tenant": grant.tenant,
        "account": grant.provider_account_id,
        "accountLabel": grant.account_label,
        "accountName": grant.account_name,
        "scopes": list(grant.scopes),
        "status": status.value,
        "reason": None if reason is None else reason.value,
        "tokenExpiresAt": when(grant.token_expires_at),
        "lastRefreshAt": when(grant.health.last_refresh_at),
        "refreshFailures": grant.health.failures,
        "nextRefreshAfter": when(grant.health.next_attempt_at),
        "createdAt": when(grant.created_at),
        "updatedAt": when(grant.updated_at),
    }


def elicitation_json(record: ElicitationRecord, tenant: str | None) -> dict[str, Any]:
    return {
        "id": record.id,
        "issuer": record.identity.issuer,
        "subject": record.identity.subject,
        "provider": record.provider,
        "scopes": list(record.scopes),
        "agent": record.agent_name,
        "tenant": tenant,
        "status": record.status.value,
        "reason": record.failure_reason,
        "createdAt": when(record.created_at),
        "expiresAt": when(record.expires_at),
        "updatedAt": when(record.updated_at),
    }


def audit_json(record: AuditRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "at": when(record.at),
        "event": record.event,
        "elicitationId": record.elicitation_id,
        "issuer": None if record.identity is None else record.identity.issuer,
        "subject": None if record.identity is None else record.identity.subject,
        "provider": record.provider,
        "detail": record.detail,
    }


def print_page(invocation: Invocation, page: Page[T], item: Callable[[T], dict[str, Any]]) -> None:
    body = {"items": [item(row) for row in page.items], "next": page.next}
    invocation.out(json.dumps(body, sort_keys=True))


def print_json(invocation: Invocation, body: dict[str, Any]) -> None:
    invocation.out(json.dumps(body, sort_keys=True))


def add_paging(command: Any) -> None:
    command.add_argument("--after", metavar="CURSOR", help="continue after this cursor (the `next` of a page)")
    command.add_argument("--limit", type=int, default=100, help="rows per page (1-1000, default 100)")
    command.add_argument("--json", action="store_true", help="one JSON object: {items, next}")


def checked_limit(invocation: Invocation) -> int:
    from .framework import UsageError

    limit = int(invocation.args.limit)
    if not 1 <= limit <= 1000:
        raise UsageError("--limit must be between 1 and 1000")
    return limit
