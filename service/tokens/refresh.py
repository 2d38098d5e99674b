"""Refreshing one grant under its lock, and what each way a refresh ends leaves stored, counted and told.

- success: the new set replaces the one the refresh started from (a conditional write: an older set never
  overwrites a newer one), the grant is active, its backoff over;
- the provider refused the grant for good (`classify`): the grant is marked `needs_user` with a reason code, its
  tokens, account and scopes kept; `grant.needs_user` is logged in the same transaction (for `/v1/events`,
  webhooks and the embedded API); it is never refreshed again until the user authorizes anew;
- transient (5xx, 429, timeout, no connection) or refused otherwise: the tokens stay as they were; the grant's
  next refresh waits a jittered, bounded backoff (the provider's Retry-After when longer), written on the row so
  every replica keeps it: a replica that takes the lock meanwhile reads it and does not call the provider.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from service.core.errors import GrantNeedsUser, GrantUnreadable, NotAuthorized, ProviderError, ProviderUnavailable
from service.core.events import Event, GrantChange, GrantChanged, GrantEvent, GrantEventKind
from service.core.handles import grant_aad
from service.core.health import HealthReason, RefreshBackoff, reason_sentence
from service.core.records import GrantRecord, TokenSet
from service.metrics import Metrics, RefreshResult
from service.oauth import ProviderGateway, ResolvedProvider
from service.store import Store
from service.store.grants import LockedGrant
from service.vault import Vault

from .classify import Kind, Verdict, classify, classify_migration

log = logging.getLogger("service.tokens")


class EventBus(Protocol):
    def publish(self, event: Event) -> None: ...
    def add_listener(self, listener: Callable[[Event], None]) -> None: ...


def grant_aad_of(grant: GrantRecord) -> bytes:
    """The associated data a grant's token ciphertext is bound to (its user, provider and account)."""
    return grant_aad(grant.identity.issuer, grant.identity.subject, grant.provider, grant.provider_account_id)


@dataclass
class Refreshed:
    """How a refresh under the lock ended: the token set to use, or the error to raise once the lock is released,
    and the events to publish after the commit."""

    tokens: TokenSet | None = None
    error: NotAuthorized | ProviderError | None = None
    published: list[GrantChanged | GrantEvent] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Renewal:
    """What a call that renews a grant's tokens under its lock is (a refresh, or a legacy grant's migration): how its
    failures are judged, and the words, audit events and metric result of each ending."""

    action: str  # in messages: "the refresh is retried in ..."
    done_event: str
    failed_event: str
    result: RefreshResult
    classify: Callable[[ProviderError, ResolvedProvider], Verdict]


REFRESH = Renewal("refresh", "refreshed", "refresh_failed", RefreshResult.REFRESHED, classify)
MIGRATION = Renewal("migration", "token_migrated", "token_migration_failed", RefreshResult.MIGRATED, classify_migration)


def needs_user_error(grant: GrantRecord, display_name: str, reason: str | None) -> GrantNeedsUser:
    code = reason or HealthReason.REVOKED.value
    sentence = reason_sentence(code, display_name) or f"the {display_name} access can no longer be used"
    return GrantNeedsUser(display_name, grant_id=grant.id, reason=code, sentence=sentence)


def unreadable_error(grant: GrantRecord, vault: Vault) -> GrantUnreadable:
    """The error for a grant `vault` cannot decrypt, logged for the operator (ids only, never the ciphertext): its
    key left the ring, or its ciphertext does not open under that key."""
    error = GrantUnreadable(grant.id, grant.provider, grant.token_key_id, key_in_ring=grant.token_key_id in vault.ring)
    log.warning("%s", error)
    return error


class Refresher:
    """The refresh of one grant while its lock is held (`TokenAccess` takes the lock and owns the caches)."""

    def __init__(
        self,
        store: Store,
        vault: Vault,
        providers: ProviderGateway,
        events: EventBus,
        clock: Callable[[], datetime],
        metrics: Metrics,
        backoff: RefreshBackoff,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.store = store
        self.vault = vault
        self.providers = providers
        self.events = events
        self.now = clock
        self.metrics = metrics
        self.backoff = backoff
        self.rand = rand

    def decrypt(self, grant: GrantRecord) -> TokenSet:
        return TokenSet.from_json(
            self.vault.decrypt_json(grant.token_key_id, grant.token_ciphertext, aad=grant_aad_of(grant))
        )

    async def attempt(self, locked: LockedGrant, tokens: TokenSet, provider: ResolvedProvider) -> Refreshed:
        """Refresh `tokens` (read under the lock, with a refresh token) unless a backoff holds it back."""
        grant = locked.grant
        call = self.providers.refresh(provider, tokens, account_id=grant.provider_account_id, now=self.now())
        return await self._renew(locked, provider, call, REFRESH)

    async def migrate(self, locked: LockedGrant, tokens: TokenSet, provider: ResolvedProvider) -> Refreshed:
        """Migrate a legacy grant's `tokens` (read under the lock: a non-expiring token, no refresh token) by the
        provider's token exchange (`legacy_token_exchange`), unless a backoff holds it back. The provider's old
        token is dead once it answers: its answer is stored before the lock is released, and a migration whose
        answer was lost is retried with the same token (Shopify answers a retry with the same pair)."""
        call = self.providers.migrate_legacy(provider, tokens, now=self.now())
        return await self._renew(locked, provider, call, MIGRATION)

    async def _renew(
        self, locked: LockedGrant, provider: ResolvedProvider, call: Coroutine[Any, Any, TokenSet], kind: Renewal
    ) -> Refreshed:
        grant, now = locked.grant, self.now()
        waiting_until = grant.health.next_attempt_at
        if waiting_until is not None and now < waiting_until:
            call.close()  # never started: no request is made
            self.metrics.refresh(grant.provider, RefreshResult.BACKED_OFF)
            retry = (waiting_until - now).total_seconds()
            message = f"{provider.display_name} is unavailable; the {kind.action} is retried in {retry:.0f} s"
            return Refreshed(error=ProviderUnavailable(message, retry_after=retry))
        try:
            fresh = await call
        except ProviderError as exc:
            return await self._failed(locked, provider, exc, kind)
        key_id, blob = self.vault.encrypt_json(fresh.to_json(), aad=grant_aad_of(grant))
        stored = await locked.update_tokens(
            token_key_id=key_id,
            token_ciphertext=blob,
            token_expires_at=None if fresh.expires_at is None else datetime.fromtimestamp(fresh.expires_at, UTC),
            scopes=fresh.scopes if fresh.scopes is not None else grant.scopes,
            now=self.now(),
        )
        if not stored:  # another process stored a newer set meanwhile (SQLite: no lock across processes): use it
            current = await self.store.grants.get(grant.id, conn=locked.tx)
            if current is None:
                return Refreshed(error=NotAuthorized("the grant was disconnected"))
            self.metrics.refresh(grant.provider, RefreshResult.REUSED)
            return Refreshed(tokens=self.decrypt(current))
        self.metrics.refresh(grant.provider, kind.result)
        await self.store.audit.record(
            kind.done_event,
            identity=grant.identity,
            provider=grant.provider,
            detail={"grant_id": grant.id},
            now=self.now(),
            conn=locked.tx,
        )
        changed = GrantChanged(grant.id, grant.identity, grant.provider, GrantChange.REFRESHED)
        return Refreshed(tokens=fresh, published=[changed])

    async def _failed(
        self, locked: LockedGrant, provider: ResolvedProvider, exc: ProviderError, kind: Renewal
    ) -> Refreshed:
        grant, now = locked.grant, self.now()
        verdict = kind.classify(exc, provider)
        check = exc.check
        if check is not None:
            log.warning("refused a %s of grant %s: %s", kind.action, grant.id, exc)
        detail: dict[str, object] = {"grant_id": grant.id, "reason": exc.code, "verdict": verdict.kind.value}
        detail.update({"check": check} if check else {})
        if verdict.kind is Kind.NEEDS_USER:
            return await self.needs_user(locked, provider, verdict, detail, kind.failed_event)
        failures = grant.health.failures + 1
        wait = self.backoff.wait(failures, verdict.retry_after, self.rand)
        await locked.refresh_failed(now=now, next_refresh_at=now + wait, failures=failures)
        detail.update(failures=failures, retry_in_seconds=round(wait.total_seconds(), 1))
        await self.store.audit.record(
            kind.failed_event, identity=grant.identity, provider=grant.provider, detail=detail, now=now, conn=locked.tx
        )
        result = RefreshResult.UNAVAILABLE if verdict.kind is Kind.UNAVAILABLE else RefreshResult.REJECTED
        self.metrics.refresh(grant.provider, result, verdict.reason)
        error: ProviderError
        if verdict.kind is Kind.UNAVAILABLE:
            retry = max(wait.total_seconds(), verdict.retry_after or 0.0)
            error = ProviderUnavailable(f"{exc}; the {kind.action} is retried in {retry:.0f} s", retry_after=retry)
        else:
            error = ProviderError(f"{exc}; the {kind.action} is retried in {wait.total_seconds():.0f} s", code=exc.code)
        return Refreshed(error=error)

    async def needs_user(
        self,
        locked: LockedGrant,
        provider: ResolvedProvider,
        verdict: Verdict,
        detail: dict[str, object],
        failed_event: str = "refresh_failed",
    ) -> Refreshed:
        """Mark the grant `needs_user` for `verdict.reason` (audited as `failed_event`, then `grant_needs_user`,
        with `grant.needs_user` logged), unless it was stored anew meanwhile."""
        grant, now = locked.grant, self.now()
        self.metrics.refresh(grant.provider, RefreshResult.NEEDS_USER, verdict.reason)
        event = GrantEvent(
            GrantEventKind.NEEDS_USER,
            grant.id,
            grant.identity,
            grant.provider,
            grant.provider_account_id,
            reason=verdict.reason,
            tenant=grant.tenant,
        )
        published: list[GrantChanged | GrantEvent] = []
        async with locked.writing() as conn:
            await self.store.audit.record(
                failed_event, identity=grant.identity, provider=grant.provider, detail=detail, now=now, conn=conn
            )
            if await locked.mark_needs_user(reason=verdict.reason, now=now, conn=conn):
                await self.store.audit.record(
                    "grant_needs_user",
                    identity=grant.identity,
                    provider=grant.provider,
                    detail={"grant_id": grant.id, "reason": verdict.reason},
                    now=now,
                    conn=conn,
                )
                published = list(await self.store.outbox.append([event], at=now, conn=conn))
        published.insert(0, GrantChanged(grant.id, grant.identity, grant.provider, GrantChange.REFRESHED))
        return Refreshed(error=needs_user_error(grant, provider.display_name, verdict.reason), published=published)
