"""The operator console's operations, for its pages (`web/admin/`) and the CLI (`acp-connector grants|elicitations|
audit`) alike: keyset pages over what the connector holds, and the three actions (revoke a grant, cancel an
elicitation, rotate a webhook secret), each audited with the operator who took it.

Reads go to `store.console` (one index range per page); actions go through the parts that own them: a grant is
revoked and deleted by `TokenAccess` (the provider's revocation, the `disconnected` audit line, `grant.revoked` or
`grant.deleted` in the event log), an elicitation ends through `Elicitations.finish` (the one way an elicitation
ends: its waiters and its agent are told), a secret is rotated by `WebhookEndpoints`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from .core.errors import FlowRefused
from .core.lifecycle import Elicitations
from .core.paging import Page, Position
from .core.records import AuditRecord, ElicitationRecord, GrantRecord, WebhookDeliveryRecord, WebhookEndpointRecord
from .core.states import ElicitationStatus
from .core.webhooks import WebhookEndpoints
from .rotation import KeyUsage, key_usage
from .store import AuditFilter, GrantCounts, GrantFilter, Store
from .tokens import TokenAccess
from .util.clock import Clock
from .vault import Vault

__all__ = ["AuditFilter", "Console", "GrantFilter", "KeyRow", "Operator", "Overview"]

OPERATOR_CANCEL_REASON = "cancelled by an operator"
DEFAULT_COUNTS_MAX_AGE = timedelta(seconds=30)
T = TypeVar("T")
log = logging.getLogger("service.console")


@dataclass(frozen=True, slots=True)
class Operator:
    """Who acts in the console: `via` is how they proved it (oidc, api_key, cli), `name` whom the audit line names
    (an OIDC operator's issuer and subject, "api-key", the CLI's OS user)."""

    name: str
    via: str

    def audit(self) -> dict[str, str]:
        """What an audit line says of the operator: who, where (console or cli) and how they signed in."""
        return {"operator": self.name, "via": "cli" if self.via == "cli" else "console", "operator_auth": self.via}


@dataclass(frozen=True, slots=True)
class Overview:
    grants: GrantCounts
    counted_at: datetime  # when `grants` was counted (a snapshot at most `Console.counts_max_age` old)
    pending: dict[ElicitationStatus, int]
    webhook_backlog: int
    webhook_oldest: datetime | None


@dataclass(frozen=True, slots=True)
class KeyRow:
    key_id: str
    state: str  # "primary", "decrypt only", "not in the ring"
    usage: KeyUsage


class Snapshot(Generic[T]):
    """A count over whole tables (a million grants cost a scan whatever the index), kept for `max_age`: read at once
    when fresh; when older, the stale one is answered and one refresh starts in the background (stale while it
    revalidates); the first read waits for the count. One count at a time per snapshot."""

    def __init__(self, count: Callable[[], Awaitable[T]], clock: Clock, max_age: timedelta) -> None:
        self._count = count
        self._clock = clock
        self._max_age = max_age
        self._value: tuple[datetime, T] | None = None
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None

    async def get(self) -> tuple[datetime, T]:
        current = self._value
        if current is None:
            async with self._lock:
                if self._value is None:
                    self._value = (self._clock(), await self._count())
                return self._value
        if self._clock() - current[0] >= self._max_age and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.create_task(self._recount())
        return current

    async def _recount(self) -> None:
        async with self._lock:
            try:
                self._value = (self._clock(), await self._count())
            except Exception:  # the stale count stays; the next read tries again
                log.warning("console: counting failed", exc_info=True)

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)


class Console:
    def __init__(
        self,
        store: Store,
        tokens: TokenAccess,
        elicitations: Elicitations,
        webhooks: WebhookEndpoints,
        vault: Vault,
        clock: Clock,
        counts_max_age: timedelta = DEFAULT_COUNTS_MAX_AGE,
    ) -> None:
        self.store = store
        self.tokens = tokens
        self.elicitations = elicitations
        self.webhooks = webhooks
        self.vault = vault
        self.clock = clock
        self.counts_max_age = counts_max_age
        self._grant_counts = Snapshot(store.console.grant_counts, clock, counts_max_age)
        self._key_usage = Snapshot(lambda: key_usage(store, clock()), clock, counts_max_age)

    async def close(self) -> None:
        await self._grant_counts.close()
        await self._key_usage.close()

    # -- reading ------------------------------------------------------------------------------------------
    async def overview(self) -> Overview:
        counted_at, counts = await self._grant_counts.get()
        pending = await self.store.elicitations.count_open()
        backlog, oldest = await self.store.webhooks.backlog()
        return Overview(counts, counted_at, pending, backlog, oldest)

    async def grants(self, where: GrantFilter, after: str | None, limit: int) -> Page[GrantRecord]:
        return await self.store.console.grants(where, after=Position.decode(after), limit=limit)

    async def elicitations_page(
        self, *, pending: bool, after: str | None, limit: int, subject: str | None = None
    ) -> Page[tuple[ElicitationRecord, str | None]]:
        return await self.store.console.elicitations(
            pending=pending, after=Position.decode(after), limit=limit, subject=subject
        )

    async def audit(self, where: AuditFilter, after: str | None, limit: int) -> Page[AuditRecord]:
        return await self.store.console.audit(where, after=Position.decode(after), limit=limit)

    async def endpoints(self, after: str | None, limit: int) -> Page[WebhookEndpointRecord]:
        return await self.store.console.endpoints(after=Position.decode(after), limit=limit)

    async def deliveries(
        self, endpoint_id: str | None, after: str | None, limit: int, *, waiting: bool = False
    ) -> Page[WebhookDeliveryRecord]:
        return await self.store.console.deliveries(
            endpoint_id, after=Position.decode(after), limit=limit, waiting=waiting
        )

    async def keys(self) -> tuple[datetime, list[KeyRow]]:
        """Every key id of the ring or the store, with what it encrypts as last counted (and when)."""
        ring = self.vault.ring
        counted_at, usage = await self._key_usage.get()
        rows = []
        for key_id in dict.fromkeys([*ring.key_ids, *usage]):
            if key_id == ring.primary_key_id:
                state = "primary"
            else:
                state = "decrypt only" if key_id in ring else "not in the ring"
            rows.append(KeyRow(key_id, state, usage.get(key_id, KeyUsage())))
        return counted_at, rows

    async def grant(self, grant_id: str) -> GrantRecord:
        found = await self.store.grants.get(grant_id)
        if found is None:
            raise FlowRefused("not_found")
        return found

    async def elicitation(self, elicitation_id: str) -> ElicitationRecord:
        found = await self.store.elicitations.get(elicitation_id)
        if found is None:
            raise FlowRefused("not_found")
        return found

    async def endpoint(self, endpoint_id: str) -> WebhookEndpointRecord:
        found = await self.store.webhooks.endpoint(endpoint_id)
        if found is None:
            raise FlowRefused("not_found")
        return found

    # -- acting -------------------------------------------------------------------------------------------
    async def revoke_grant(self, grant_id: str, operator: Operator) -> bool:
        """Revoke the grant at its provider (where it allows) and delete it; the `disconnected` audit line names
        the operator. False when it was gone already (nothing happened)."""
        grant = await self.store.grants.get(grant_id)
        if grant is None:
            return False
        return await self.tokens.disconnect_grant(grant, detail=operator.audit())

    async def cancel_elicitation(self, elicitation_id: str, operator: Operator) -> bool:
        """End an open elicitation as cancelled (its agent and waiters are told); the `cancelled` audit line names
        the operator. False when it had ended already."""
        record = await self.elicitation(elicitation_id)
        if record.status.terminal:
            return False
        ended = await self.elicitations.finish(
            record,
            ElicitationStatus.CANCELLED,
            "cancelled",
            reason=OPERATOR_CANCEL_REASON,
            detail={"cause": "operator", **operator.audit()},
        )
        return ended is not None

    async def rotate_secret(
        self, endpoint_id: str, operator: Operator, overlap: timedelta
    ) -> tuple[WebhookEndpointRecord, str]:
        """A new signing secret (returned once), the current one signing alongside it for `overlap`."""
        endpoint = await self.endpoint(endpoint_id)
        try:
            rotated, secret = await self.webhooks.rotate_secret(endpoint, overlap)
        except LookupError:
            raise FlowRefused("not_found") from None
        await self.store.audit.record(
            "webhook_secret_rotated",
            detail={
                "webhook_id": endpoint.id,
                "tenant": endpoint.tenant,
                "overlap_seconds": int(overlap.total_seconds()),
                **operator.audit(),
            },
            now=self.clock(),
        )
        return rotated, secret


def as_json(value: Any) -> Any:
    """A record of a page as plain JSON values (the CLI's --json; never a token or a secret)."""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value
