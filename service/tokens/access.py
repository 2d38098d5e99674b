"""Using a stored grant: find it, decrypt its tokens, refresh them single-flight, disconnect it.

Tokens leave this module only inside the Authorization header of a request to the provider's own API host.
Two caches keep token use cheap: grant lookups by (user, provider, scopes) and decrypted token sets by grant.
Both drop what they hold for a grant on every `GrantChanged` event on the bus (stored, refreshed, deleted), from
this process or, with a bus that crosses processes, from any other sharing the database.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime

from service.core.coverage import find_grant
from service.core.errors import ConnectorError, NotAuthorized, ProviderError
from service.core.events import Event, GrantChange, GrantChanged, GrantEvent, GrantEventKind
from service.core.health import HealthReason, RefreshBackoff
from service.core.identity import Identity
from service.core.records import GrantRecord, TokenSet
from service.metrics import Metrics, RefreshResult
from service.oauth import ProviderGateway, ResolvedProvider
from service.oauth.dpop import Dpop
from service.oauth.token import is_legacy
from service.store import Store
from service.util.bounded import Bounded
from service.util.locks import KeyedLocks
from service.vault import Vault

from .classify import Kind, Verdict
from .refresh import EventBus, Refreshed, Refresher, needs_user_error

log = logging.getLogger("service.tokens")

# A token is refreshed when this share of its lifetime is left, and never earlier than this many seconds before
# it expires: a one-hour token 60 s ahead, a 30-second token 3 s ahead (so not on every call).
REFRESH_AHEAD_SHARE = 0.1
REFRESH_AHEAD_MAX_SECONDS = 60.0
GRANT_LOOKUPS_KEPT = 10_000
_Lookup = tuple[frozenset[str], frozenset[str], str | None]  # scopes asked, tenants seen, the account named
# Decrypted token sets, DPoP keys and uses kept per grant: the most recent this many grants (a grant that falls out
# is read and decrypted again at its next use, or not refreshed ahead by this replica).
GRANTS_KEPT = 10_000


def refresh_margin(tokens: TokenSet) -> float:
    """How many seconds before its expiry the access token is refreshed."""
    if tokens.expires_at is None or tokens.issued_at is None or tokens.expires_at <= tokens.issued_at:
        return REFRESH_AHEAD_MAX_SECONDS  # a lifetime we do not know (grants stored before issued_at was kept)
    return min(REFRESH_AHEAD_MAX_SECONDS, REFRESH_AHEAD_SHARE * (tokens.expires_at - tokens.issued_at))


class TokenAccess:
    def __init__(
        self,
        store: Store,
        vault: Vault,
        providers: ProviderGateway,
        events: EventBus,
        clock: Callable[[], datetime],
        metrics: Metrics | None = None,
        backoff: RefreshBackoff | None = None,
    ) -> None:
        self.store = store
        self.vault = vault
        self.providers = providers
        self.events = events
        self.now = clock
        self.metrics = metrics or providers.metrics
        self.refresher = Refresher(store, vault, providers, events, clock, self.metrics, backoff or RefreshBackoff())
        self._locks = KeyedLocks[str]()  # one per grant being refreshed; gone when no one uses it
        # Decrypted token sets by grant id, so a request does not cost a database read and a decryption.
        # A set is used from here only while it is not due for refresh; a refresh (due, or a 401 on the cached
        # token) reads the database again under the grant's lock, where another process may have stored one.
        self._tokens: Bounded[str, TokenSet] = Bounded(GRANTS_KEPT)
        # DPoP-bound grants: grant id -> (the private JWK of the set held, its parsed key and the nonces).
        self._dpop: Bounded[str, tuple[Mapping[str, str], Dpop | None]] = Bounded(GRANTS_KEPT)
        # Grant lookups: (issuer, subject, provider) -> {(scopes asked, tenants seen, account): grant}, newest use
        # last.
        self._grants: OrderedDict[tuple[str, str, str], dict[_Lookup, GrantRecord]] = OrderedDict()
        # Lookups being read now: pair -> [readers, changes heard meanwhile]. A read's result is cached only if no
        # change to that user's grants at that provider was heard while it read; the entry goes with its last reader
        # (a count per pair kept for good would grow by one for every user whose grant ever changed).
        self._reading: dict[tuple[str, str, str], list[int]] = {}
        # Grants this process used: grant id -> (when, provider), for refreshing ahead (`used_since`).
        self._used: Bounded[str, tuple[float, str]] = Bounded(GRANTS_KEPT)
        events.add_listener(self._on_event)

    def tables(self) -> dict[str, int]:
        """How many entries each per-user and per-grant table holds (each bounded; `reading` and `locks` are 0
        whenever no lookup or refresh runs)."""
        return {
            "grant_lookups": len(self._grants),
            "reading": len(self._reading),
            "token_sets": len(self._tokens),
            "dpop_keys": len(self._dpop),
            "grants_used": len(self._used),
            "locks": len(self._locks),
        }

    # -- finding a grant -----------------------------------------------------------------------------------
    async def grant_for(
        self,
        user: Identity,
        provider: str,
        scopes: Sequence[str],
        tenants: Collection[str],
        *,
        account: str | None = None,
        display_name: str | None = None,
    ) -> GrantRecord | None:
        """The newest grant of `user` at `provider` covering `scopes`, held by one of `tenants` (the caller's and
        those it shares with), of the account `account` names (`service.core.accounts`: AccountChoiceNeeded, naming
        the accounts by `display_name`'s provider, when it names none and the user holds several); cached until the
        grant changes."""
        pair = (user.issuer, user.subject, provider)
        wanted = (frozenset(scopes), frozenset(tenants), account)
        known = self._grants.get(pair)
        if known is not None and wanted in known:
            self._grants.move_to_end(pair)
            return known[wanted]
        reading = self._reading.setdefault(pair, [0, 0])
        reading[0] += 1
        generation = reading[1]
        try:
            grant = await find_grant(
                self.store.grants, user, provider, scopes, tenants, account=account, display_name=display_name
            )
        finally:
            reading[0] -= 1
            if not reading[0]:
                del self._reading[pair]
        # Kept only if no change to this user's grants at this provider was announced while we read.
        if grant is not None and reading[1] == generation:
            self._grants.setdefault(pair, {})[wanted] = grant
            self._grants.move_to_end(pair)
            while len(self._grants) > GRANT_LOOKUPS_KEPT:
                self._grants.popitem(last=False)
        return grant

    def _on_event(self, event: Event) -> None:
        if isinstance(event, GrantChanged):
            pair = (event.identity.issuer, event.identity.subject, event.provider)
            if (reading := self._reading.get(pair)) is not None:
                reading[1] += 1
            self._grants.pop(pair, None)
            self._tokens.pop(event.grant_id, None)
            self._dpop.pop(event.grant_id, None)
            if event.change is GrantChange.DELETED:
                self._used.pop(event.grant_id, None)

    def _changed(self, grant: GrantRecord, change: GrantChange) -> None:
        self.events.publish(GrantChanged(grant.id, grant.identity, grant.provider, change))

    # -- tokens ----------------------------------------------------------------------------------------------
    def decrypt(self, grant: GrantRecord) -> TokenSet:
        return self.refresher.decrypt(grant)

    def dpop(self, grant_id: str) -> Dpop | None:
        """The DPoP key (and the providers' nonces) of the grant's token as last handed out by `access_token`; None
        for a Bearer token."""
        cached = self._tokens.get(grant_id)
        if cached is None or cached.dpop_key is None:
            return None
        known = self._dpop.get(grant_id)
        if known is None or known[0] is not cached.dpop_key:  # the key is read once per token set held
            known = self._dpop[grant_id] = (cached.dpop_key, self.providers.dpop(cached))
        return known[1]

    def connection(self, grant: GrantRecord) -> dict[str, str]:
        """The grant's per-connection values (a tenant, a subdomain, an instance URL), from its token set."""
        cached = self._tokens.get(grant.id)
        return dict((cached or self.decrypt(grant)).connection)

    def shown_connection(self, grant: GrantRecord) -> dict[str, str]:
        """The grant's per-connection values that may be shown (grant metadata): all but those declared secret."""
        entry = self.providers.catalog.get(grant.provider) if grant.provider in self.providers.catalog else None
        if entry is None or not entry.quirks.connection:
            return {}  # nothing to show: no decryption
        secret = {value.name for value in entry.quirks.connection if value.secret}
        return {name: value for name, value in self.connection(grant).items() if name not in secret}

    def bound(self, grant: GrantRecord, provider: ResolvedProvider) -> ResolvedProvider:
        """`provider` with its URLs (the API base too) filled with the grant's per-connection values."""
        if not provider.quirks.connection:
            return provider
        values = self.connection(grant)
        return provider.bound(values) if values else provider

    def _due(self, tokens: TokenSet, ahead: float = 0.0) -> bool:
        return tokens.expires_within(max(refresh_margin(tokens), ahead), now=self.now().timestamp())

    def _must_refresh(
        self, tokens: TokenSet, provider: ResolvedProvider, stale: str | None, ahead: float = 0.0
    ) -> bool:
        """Whether `tokens` must be renewed before use: due (or expiring within `ahead` seconds), its access token is
        the one just rejected, or it is a legacy grant's non-expiring token the provider migrates."""
        if stale is not None and tokens.access_token == stale:
            return True
        return self._due(tokens, ahead) or is_legacy(provider, tokens)

    async def access_token(self, grant_id: str, provider: ResolvedProvider, *, stale: str | None = None) -> str:
        """A usable access token; refreshes when due, or when the caller saw `stale` rejected; a legacy grant (a
        non-expiring token its provider migrates, `legacy_token_exchange`) is migrated first."""
        self._used[grant_id] = (self.now().timestamp(), provider.name)
        self._used.move_to_end(grant_id)  # the least recently used go first
        return await self._token(grant_id, provider, stale, 0.0)

    def used_since(self, moment: datetime) -> dict[str, str]:
        """The grants this process used at or after `moment`: grant id -> provider (older uses are forgotten)."""
        cutoff = moment.timestamp()
        for grant_id in [grant_id for grant_id, (at, _) in self._used.items() if at < cutoff]:
            del self._used[grant_id]
        return {grant_id: provider for grant_id, (_, provider) in self._used.items()}

    def expiring_within(self, grant_id: str, seconds: float) -> bool | None:
        """Whether the grant's access token, as this process holds it, expires within `seconds` (None: not held)."""
        cached = self._tokens.get(grant_id)
        return None if cached is None else self._due(cached, seconds)

    async def refresh_ahead(self, grant_id: str, provider: ResolvedProvider, ahead: float) -> None:
        """Refresh the grant's tokens now if they expire within `ahead` seconds (the same lock and checks as a
        refresh on use: across replicas one refresh reaches the provider). Not a use of the grant."""
        await self._token(grant_id, provider, None, ahead)

    async def migrate(self, grant_id: str, provider: ResolvedProvider) -> None:
        """Migrate a legacy grant now if it still is one (`grants migrate`), through the locks a use takes: a grant
        used meanwhile, on any replica, is exchanged once. Not a use. Raises what a use would (GrantNeedsUser,
        ProviderError: a transient failure is not hidden behind the old token here)."""
        await self._token(grant_id, provider, None, 0.0, fallback=False)

    async def _token(
        self, grant_id: str, provider: ResolvedProvider, stale: str | None, ahead: float, *, fallback: bool = True
    ) -> str:
        cached = self._tokens.get(grant_id)
        if cached is not None and not self._must_refresh(cached, provider, stale, ahead):
            return cached.access_token
        async with self._locks.hold(grant_id):
            cached = self._tokens.get(grant_id)  # another task here may have refreshed it meanwhile
            if cached is not None and not self._must_refresh(cached, provider, stale, ahead):
                return cached.access_token
            if cached is None:  # the first use in this process (or since the grant changed): the stored set may do
                grant = await self.store.grants.get(grant_id)
                if grant is None:
                    raise NotAuthorized("the grant was disconnected")
                if grant.health.needs_user:  # never refreshed again, nor used, until the user authorizes anew
                    raise needs_user_error(grant, provider.display_name, grant.health.reason)
                cached = self._tokens[grant_id] = self.decrypt(grant)
                if not self._must_refresh(cached, provider, stale, ahead):
                    return cached.access_token
            return await self._refresh(grant_id, provider, stale, ahead, fallback)

    async def _refresh(
        self, grant_id: str, provider: ResolvedProvider, stale: str | None, ahead: float, fallback: bool
    ) -> str:
        """Refresh (or migrate a legacy grant) under the grant's lock (one replica at a time), unless what is stored
        by then will do.

        The set read once the lock is held is the newest: a replica that refreshed first stored its result (with
        a rotated refresh token) before it released the lock, and so does this one. A failed or timed-out
        provider call changes no stored token (README, Operations: Replicas); `Refresher` says what it records.
        """
        async with self.store.grants.locked_for_refresh(grant_id) as locked:
            if locked is None:
                self._tokens.pop(grant_id, None)
                raise NotAuthorized("the grant was disconnected")
            grant, tokens = locked.grant, self.decrypt(locked.grant)
            if grant.health.needs_user:
                self._tokens.pop(grant_id, None)
                raise needs_user_error(grant, provider.display_name, grant.health.reason)
            if not self._must_refresh(tokens, provider, stale, ahead):
                self.metrics.refresh(grant.provider, RefreshResult.REUSED)  # another replica refreshed first
                self._tokens[grant_id] = tokens
                return tokens.access_token
            bound = provider.bound(tokens.connection) if tokens.connection else provider
            if is_legacy(provider, tokens):
                result = await self.refresher.migrate(locked, tokens, bound)
            elif tokens.refresh_token is None:
                self._tokens[grant_id] = tokens
                if stale is not None:
                    raise NotAuthorized(f"the {provider.display_name} token was rejected and cannot be refreshed")
                return tokens.access_token
            else:
                result = await self.refresher.attempt(locked, tokens, bound)
        return self._settle(grant_id, tokens, result, stale, fallback)

    def _settle(self, grant_id: str, before: TokenSet, result: Refreshed, stale: str | None, fallback: bool) -> str:
        """After the lock's commit: publish what changed, then answer. A transient failure still answers with the
        token it had when that one has not expired and was not just rejected (it is only due for refresh, or a
        legacy token still waiting for its migration), unless `fallback` is off."""
        for event in result.published:
            self.events.publish(event)
        if result.tokens is not None:
            self._tokens[grant_id] = result.tokens
            return result.tokens.access_token
        assert result.error is not None
        if isinstance(result.error, NotAuthorized):
            self._tokens.pop(grant_id, None)
            raise result.error
        usable = fallback and stale != before.access_token and not before.expires_within(0, now=self.now().timestamp())
        if usable:
            return before.access_token
        raise result.error

    # -- credentials (API keys, HTTP Basic) -----------------------------------------------------------------
    async def credential(self, grant_id: str, provider: ResolvedProvider) -> Mapping[str, str]:
        """The values of a credential grant (decrypted once, cached until the grant changes); GrantNeedsUser when
        the provider refused them before."""
        cached = self._tokens.get(grant_id)
        if cached is None:
            grant = await self.store.grants.get(grant_id)
            if grant is None:
                raise NotAuthorized("the grant was disconnected")
            if grant.health.needs_user:
                raise needs_user_error(grant, provider.display_name, grant.health.reason)
            cached = self._tokens[grant_id] = self.decrypt(grant)
        if not cached.credential:
            raise NotAuthorized(f"the {provider.display_name} grant holds no credential")
        return cached.credential

    async def credential_rejected(self, grant_id: str, provider: ResolvedProvider) -> NotAuthorized:
        """The provider answered 401 to the grant's credential: mark it `needs_user` (reason `key_rejected`, with
        `grant.needs_user` logged); the error for the caller to raise."""
        async with self.store.grants.locked_for_refresh(grant_id) as locked:
            if locked is None:
                self._tokens.pop(grant_id, None)
                return NotAuthorized("the grant was disconnected")
            verdict = Verdict(Kind.NEEDS_USER, HealthReason.KEY_REJECTED.value)
            detail: dict[str, object] = {"grant_id": grant_id, "reason": "http_401", "verdict": "needs_user"}
            result = await self.refresher.needs_user(locked, provider, verdict, detail, "credential_rejected")
        self._tokens.pop(grant_id, None)
        for event in result.published:
            self.events.publish(event)
        assert isinstance(result.error, NotAuthorized)
        return result.error

    # -- disconnecting -------------------------------------------------------------------------------------
    async def disconnect(self, user: Identity, provider: str, tenants: Collection[str]) -> int:
        """Revoke (where the provider allows) and delete every grant of `user` at `provider` held by one of
        `tenants`; how many went."""
        self.providers.entry(provider)  # UnknownProvider for a name the catalog does not have
        resolved = await self._for_revocation(provider)
        removed = 0
        for grant in await self.store.grants.find(user, provider, tenants=tenants):
            removed += await self._disconnect(grant, resolved)
        return removed

    async def disconnect_grant(self, grant: GrantRecord, *, detail: Mapping[str, object] | None = None) -> bool:
        """Revoke one grant (where the provider allows) and delete it; True when this call deleted it. `detail`
        joins the audit line (who asked: an operator)."""
        return await self._disconnect(grant, await self._for_revocation(grant.provider), detail)

    async def _for_revocation(self, provider: str) -> ResolvedProvider | None:
        if provider not in self.providers.catalog or not self.providers.entry(provider).configured:
            return None
        try:
            return await self.providers.resolve(provider)
        except ConnectorError as exc:
            log.warning("disconnect: %s; the grants are deleted without revocation", exc)
            return None

    async def _disconnect(
        self, grant: GrantRecord, resolved: ResolvedProvider | None, detail: Mapping[str, object] | None = None
    ) -> bool:
        """Revoke, then delete the row, audit it and log `grant.revoked` (the provider confirmed the revocation) or
        `grant.deleted` (it did not, or cannot) in one transaction."""
        revoked = False
        if resolved is not None:
            tokens = self.decrypt(grant)
            try:
                bound = resolved.bound(tokens.connection) if tokens.connection else resolved
            except ProviderError as exc:
                log.warning("disconnect: %s; the grant is deleted without revocation", exc)
            else:
                revoked = await self.providers.revoke(bound, tokens)
        kind = GrantEventKind.REVOKED if revoked else GrantEventKind.DELETED
        event = GrantEvent(
            kind, grant.id, grant.identity, grant.provider, grant.provider_account_id, tenant=grant.tenant
        )
        now = self.now()
        logged: list[GrantEvent] = []
        async with self.store.transaction() as tx:
            deleted = await self.store.grants.delete(grant.id, conn=tx)
            if deleted:
                await self.store.audit.record(
                    "disconnected",
                    identity=grant.identity,
                    provider=grant.provider,
                    detail={**(detail or {}), "grant_id": grant.id, "revoked": revoked},
                    now=now,
                    conn=tx,
                )
                logged = await self.store.outbox.append([event], at=now, conn=tx)
        self._changed(grant, GrantChange.DELETED)
        for logged_event in logged:
            self.events.publish(logged_event)
        return deleted
