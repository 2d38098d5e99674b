"""The embedded API an agent calls: request authorization over ACP, use a grant, disconnect.

An agent builds one `Connector`, serves its web routes (`serve()` or `asgi_app()`), and for each tool
that needs a provider calls `request_authorization(...)` with its ACP connection. Tokens never come back.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .acp_bridge import (
    AcpLink,
    AgentConnection,
    AnswerKind,
    StateListener,
    send_completion,
    send_url_elicitation,
    url_mode_advertised,
)
from .config import Settings, load_settings
from .errors import ConfigError, NotAuthorized
from .events import ElicitationEvent
from .foreground import ForegroundTracker
from .identity import Identity
from .identity.base import IdentityVerifier
from .identity.factory import build_verifier
from .lifecycle import audit_elicitation, finish
from .oauth import revoke
from .providers import load_catalog
from .runtime import Runtime
from .scopes import ElicitationScope, RequestScope, SessionScope
from .states import ElicitationStatus
from .store import ElicitationRecord, GrantRecord, Store
from .tokens import GrantAuth, TokenAccess
from .vault import Vault, load_key_ring

if TYPE_CHECKING:
    from starlette.applications import Starlette

log = logging.getLogger("service.connector")

# While waiting for the browser, re-read the database this often: the bus is a wake-up call, not the truth.
POLL_SECONDS = 2.0


class AuthorizationStatus(StrEnum):
    AUTHORIZED = "authorized"  # the user finished the flow in the browser; a grant is stored
    ALREADY_AUTHORIZED = "already_authorized"  # a stored grant covered the scopes; nothing was sent
    UNSUPPORTED = "unsupported"  # the client did not advertise URL-mode elicitation; nothing was sent
    DECLINED = "declined"  # the user declined, in the client, on the consent page or at the provider
    CANCELLED = "cancelled"  # the client dismissed the request without choosing
    CLIENT_ERROR = "client_error"  # the client answered elicitation/create with a JSON-RPC error
    DISCONNECTED = "disconnected"  # the ACP connection closed before the flow finished
    EXPIRED = "expired"  # the elicitation's time ran out before the flow finished
    FAILED = "failed"  # the provider refused or failed; `reason` says how


_MESSAGES: dict[AuthorizationStatus, str] = {
    AuthorizationStatus.AUTHORIZED: "Access to {provider} was granted.",
    AuthorizationStatus.ALREADY_AUTHORIZED: "Access to {provider} was already granted.",
    AuthorizationStatus.UNSUPPORTED: (
        "This client cannot open authorization links (it does not support URL-mode elicitation), "
        "so access to {provider} cannot be requested here."
    ),
    AuthorizationStatus.DECLINED: "The user declined access to {provider}.",
    AuthorizationStatus.CANCELLED: "The request for access to {provider} was dismissed.",
    AuthorizationStatus.CLIENT_ERROR: "The client refused the request for access to {provider}.",
    AuthorizationStatus.DISCONNECTED: "The client disconnected before access to {provider} was granted.",
    AuthorizationStatus.EXPIRED: "The request for access to {provider} expired before it was completed.",
    AuthorizationStatus.FAILED: "Authorization with {provider} failed.",
}


@dataclass(frozen=True, slots=True)
class GrantInfo:
    """What an agent may know about a grant: never the token."""

    id: str
    provider: str
    account_id: str
    scopes: tuple[str, ...]
    token_expires_at: datetime | None

    @classmethod
    def of(cls, grant: GrantRecord) -> GrantInfo:
        return cls(grant.id, grant.provider, grant.provider_account_id, grant.scopes, grant.token_expires_at)


@dataclass(frozen=True, slots=True)
class AuthorizationOutcome:
    status: AuthorizationStatus
    provider: str
    elicitation_id: str | None = None
    grant: GrantInfo | None = None
    reason: str | None = None
    error_code: int | None = None  # the JSON-RPC error code, for CLIENT_ERROR

    @property
    def ok(self) -> bool:
        return self.status in (AuthorizationStatus.AUTHORIZED, AuthorizationStatus.ALREADY_AUTHORIZED)

    def describe(self) -> str:
        """A sentence safe to show the user or the model."""
        text = _MESSAGES[self.status].format(provider=self.provider)
        return f"{text} ({self.reason})" if self.reason and not self.ok else text


_TERMINAL_OUTCOMES = {
    ElicitationStatus.COMPLETED: AuthorizationStatus.AUTHORIZED,
    ElicitationStatus.DECLINED: AuthorizationStatus.DECLINED,
    ElicitationStatus.CANCELLED: AuthorizationStatus.CANCELLED,
    ElicitationStatus.EXPIRED: AuthorizationStatus.EXPIRED,
    ElicitationStatus.FAILED: AuthorizationStatus.FAILED,
}


class Connector:
    """One connector instance: its database, vault, provider catalog and web routes."""

    def __init__(self, runtime: Runtime, verifier: IdentityVerifier) -> None:
        self.runtime = runtime
        self.verifier = verifier
        self.tokens = TokenAccess(runtime)
        self._links: weakref.WeakKeyDictionary[Any, AcpLink] = weakref.WeakKeyDictionary()
        self._links_by_key: weakref.WeakValueDictionary[str, AcpLink] = weakref.WeakValueDictionary()
        self.foreground = ForegroundTracker()
        self._deliveries: dict[str, asyncio.Task[None]] = {}
        runtime.bus.add_listener(self._on_event)

    # -- construction --------------------------------------------------------------------------------------
    @classmethod
    def from_settings(cls, settings: Settings) -> Connector:
        ring = load_key_ring(settings.vault.keys, settings.vault.key_file, settings.vault.primary_key_id)
        if ring is None:
            raise ConfigError(
                str(settings.config_file or "environment"),
                "vault.keys",
                "no token-encryption key is configured: run `acp-connector keys generate` and set "
                "CONNECTOR_VAULT__KEYS or vault.key_file",
            )
        catalog = load_catalog(settings.providers.catalog)
        runtime = Runtime(
            settings=settings, store=Store.from_url(settings.database.url), vault=Vault(ring), catalog=catalog
        )
        return cls(runtime, build_verifier(runtime))  # ConfigError when the verifier's settings are incomplete

    @classmethod
    def from_config(cls, path: str | Path | None = None) -> Connector:
        return cls.from_settings(load_settings(path))

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    async def start(self) -> None:
        """Refuse to run on an unmigrated or newer-schema database."""
        await self.runtime.store.check_schema()

    async def close(self) -> None:
        pending = list(self._deliveries.values())
        await asyncio.gather(*pending, return_exceptions=True)
        await self.runtime.http.aclose()
        await self.runtime.store.close()

    async def __aenter__(self) -> Connector:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def asgi_app(self) -> Starlette:
        from .web.app import create_app

        return create_app(self)

    async def serve(self) -> None:
        """Serve the web routes on the configured host and port until cancelled."""
        from .web.server import serve

        await serve(self.asgi_app(), self.settings.server.host, self.settings.server.port)

    # -- the agent's API -------------------------------------------------------------------------------------
    def attach(self, conn: AgentConnection, *, on_state: StateListener | None = None) -> AcpLink:
        """Start tracking a client connection. Call it from the agent's `on_connect`, before `initialize`.

        The connector then reads the client's capabilities (v1 `clientCapabilities` or v2 `capabilities`)
        and the negotiated protocol version from the wire, can cancel its own pending requests with
        `$/cancel_request`, and answers the client's `$/cancel_request`. `on_state(session_id, state)` hears
        foreground-state transitions (on v2 connections they are also sent as `state_update`).
        """
        link = self._links.get(conn)
        if link is None:
            link = AcpLink(conn)
            self._links[conn] = link
            self._links_by_key[link.key] = link
        self.foreground.listen(link, on_state)
        return link

    async def request_authorization(
        self,
        conn: AgentConnection,
        client_capabilities: Any = None,
        *,
        user: Identity,
        provider: str,
        scope: ElicitationScope,
        scopes: Sequence[str] | None = None,
        message: str | None = None,
        foreground: bool = True,
    ) -> AuthorizationOutcome:
        """Make sure `user` holds a grant at `provider` covering `scopes`, asking through the client if needed.

        `client_capabilities` (SDK model or raw JSON) is needed only when the connection was not attached
        before `initialize`; the capabilities seen on the wire take precedence. `foreground=False` marks a
        request for background activity: it changes no session's foreground state.

        Returns when the grant exists, or with the reason it does not. If the calling task is cancelled, the
        pending `elicitation/create` is cancelled with `$/cancel_request` and the elicitation ends as
        cancelled. Raises `ProviderNotConfigured` or `UnknownProvider` for a provider the operator has not set up.
        """
        entry = self.runtime.catalog.require_configured(provider)
        wanted = tuple(scopes) if scopes is not None else tuple(entry.default_scopes)
        existing = await self.tokens.find_grant(user, provider, wanted)
        if existing is not None:
            return AuthorizationOutcome(AuthorizationStatus.ALREADY_AUTHORIZED, provider, grant=GrantInfo.of(existing))
        link = self.attach(conn)
        if link.initialize_params is not None:
            client_capabilities = link.raw_capabilities
        if not url_mode_advertised(client_capabilities):
            await self.runtime.store.audit.record(
                "unsupported_client", identity=user, provider=provider, now=self.runtime.now()
            )
            return AuthorizationOutcome(AuthorizationStatus.UNSUPPORTED, provider)

        record = await self._create(
            link,
            user,
            entry.name,
            wanted,
            scope,
            message or self._default_message(entry.display_name, wanted),
        )
        blocking = foreground and isinstance(scope, SessionScope)
        session_id = scope.session_id if isinstance(scope, SessionScope) else ""
        if blocking:
            await self.foreground.block(link, session_id)
        cancelled = False
        try:
            async with self.runtime.bus.subscribe(record.id) as events:
                answer = await send_url_elicitation(
                    conn,
                    elicitation_id=record.id,
                    url=self.runtime.connect_url(record.id),
                    message=record.message,
                    scope=scope,
                )
                if answer.kind is AnswerKind.ACCEPT:
                    await self._consented(record)
                    return await self._await_browser(link, record, events)
                return await self._answered_without_consent(record, answer.kind, answer.error_code)
        except asyncio.CancelledError:
            cancelled = True
            await self._cancelled(link, record)
            raise
        finally:
            if blocking:
                # The work resumes (`running`) with whatever outcome, or ends without resuming (`idle`).
                await self.foreground.unblock(link, session_id, ended=cancelled)

    async def find_grant(self, user: Identity, provider: str, scopes: Sequence[str] = ()) -> GrantInfo | None:
        grant = await self.tokens.find_grant(user, provider, scopes)
        return GrantInfo.of(grant) if grant is not None else None

    @asynccontextmanager
    async def http(
        self, user: Identity, provider: str, *, scopes: Sequence[str] = (), **client_kwargs: Any
    ) -> AsyncIterator[httpx.AsyncClient]:
        """An httpx client for the provider's API with the user's token injected (and refreshed) server-side.

        Requests to any other host are refused before they are sent, so the token cannot be steered elsewhere.
        """
        entry = self.runtime.catalog.require_configured(provider)
        grant = await self.tokens.find_grant(user, provider, scopes)
        if grant is None:
            raise NotAuthorized(f"{user} has no {entry.display_name} grant with scopes {list(scopes)}")
        client_kwargs.setdefault("timeout", 30.0)
        async with httpx.AsyncClient(
            base_url=entry.api_base_url or "", auth=GrantAuth(self.tokens, grant.id, entry), **client_kwargs
        ) as client:
            yield client

    async def disconnect(self, user: Identity, provider: str) -> int:
        """Revoke (where the provider allows) and delete every grant of `user` at `provider`."""
        entry = self.runtime.catalog.get(provider)
        removed = 0
        for grant in await self.runtime.store.grants.find(user, provider):
            if entry.configured:
                await revoke(entry, self.tokens.decrypt(grant))
            self.tokens.forget(grant.id)
            if await self.runtime.store.grants.delete(grant.id):
                removed += 1
                await self.runtime.store.audit.record(
                    "disconnected",
                    identity=user,
                    provider=provider,
                    detail={"grant_id": grant.id},
                    now=self.runtime.now(),
                )
        return removed

    # -- internals ----------------------------------------------------------------------------------------
    @staticmethod
    def _default_message(display_name: str, scopes: Sequence[str]) -> str:
        listed = ", ".join(scopes) if scopes else "basic access"
        return f"Authorize access to your {display_name} account ({listed})."

    async def _create(
        self,
        link: AcpLink,
        user: Identity,
        provider: str,
        scopes: tuple[str, ...],
        scope: ElicitationScope,
        message: str,
    ) -> ElicitationRecord:
        now = self.runtime.now()
        record = ElicitationRecord(
            id=secrets.token_urlsafe(24),  # 192 random bits
            connection_key=link.key,
            identity=user,
            provider=provider,
            scopes=scopes,
            scope_kind="session" if isinstance(scope, SessionScope) else "request",
            session_id=scope.session_id if isinstance(scope, SessionScope) else None,
            tool_call_id=scope.tool_call_id if isinstance(scope, SessionScope) else None,
            request_id=scope.request_id if isinstance(scope, RequestScope) else None,
            agent_name=self.settings.agent_name,
            message=message,
            status=ElicitationStatus.PENDING,
            failure_reason=None,
            created_at=now,
            expires_at=now + timedelta(seconds=self.settings.elicitation.ttl_seconds),
            updated_at=now,
        )
        async with self.runtime.store.transaction() as db:
            await self.runtime.store.elicitations.insert(record, conn=db)
            await audit_elicitation(
                self.runtime,
                record,
                "created",
                detail={"scopes": list(scopes), "scope_kind": record.scope_kind},
                now=now,
                conn=db,
            )
        return record

    async def _consented(self, record: ElicitationRecord) -> None:
        # The browser may already be ahead (verified, authorizing, even completed): then this is a no-op.
        if await self.runtime.store.elicitations.transition(
            record.id, ElicitationStatus.CONSENTED, now=self.runtime.now()
        ):
            await audit_elicitation(self.runtime, record, "consented")

    async def _answered_without_consent(
        self, record: ElicitationRecord, kind: AnswerKind, error_code: int | None
    ) -> AuthorizationOutcome:
        if kind is AnswerKind.DECLINE:
            status, target, reason = (
                AuthorizationStatus.DECLINED,
                ElicitationStatus.DECLINED,
                "declined in the client",
            )
        elif kind is AnswerKind.CANCEL:
            status, target, reason = (
                AuthorizationStatus.CANCELLED,
                ElicitationStatus.CANCELLED,
                "dismissed in the client",
            )
        elif kind is AnswerKind.DISCONNECTED:
            status, target, reason = (
                AuthorizationStatus.DISCONNECTED,
                ElicitationStatus.FAILED,
                "client connection closed",
            )
        else:
            status, target = AuthorizationStatus.CLIENT_ERROR, ElicitationStatus.FAILED
            reason = f"client answered with JSON-RPC error {error_code}"
        if await finish(self.runtime, record, target, status.value, reason=reason):
            return AuthorizationOutcome(status, record.provider, record.id, reason=reason, error_code=error_code)
        # Something else ended it first (the browser can finish before the client's answer arrives).
        return await self._outcome_of(record.id)

    async def _cancelled(self, link: AcpLink, record: ElicitationRecord) -> None:
        """The work waiting on this elicitation was cancelled: cancel our request and end the elicitation.

        The browser flow may still finish on its own (the grant is then stored), but nothing resumes the
        cancelled work and no `elicitation/complete` is sent for it: the client was told to drop it.
        """
        request_id = link.pending_request_id(record.id)
        if request_id is not None:
            await link.cancel_request(request_id)
        await finish(
            self.runtime,
            record,
            ElicitationStatus.CANCELLED,
            "cancelled",
            reason="the agent's work was cancelled",
            detail={"request_cancelled": request_id is not None},
            close_flows=False,
        )

    async def _await_browser(
        self, link: AcpLink, record: ElicitationRecord, events: asyncio.Queue[ElicitationEvent]
    ) -> AuthorizationOutcome:
        while True:
            current = await self.runtime.store.elicitations.get(record.id)
            if current is None:  # pragma: no cover - rows are never deleted while waited on
                return AuthorizationOutcome(AuthorizationStatus.FAILED, record.provider, record.id, reason="lost")
            if current.status.terminal:
                return await self._outcome_of(record.id, current)
            remaining = (current.expires_at - self.runtime.now()).total_seconds()
            if remaining <= 0:
                await finish(
                    self.runtime,
                    current,
                    ElicitationStatus.EXPIRED,
                    "expired",
                    reason="expired while waiting",
                )
                continue
            if link.closed():
                # The user may still be in the browser: the elicitation stays open and a grant that arrives
                # later is stored. Only the notification has nowhere to go.
                await audit_elicitation(self.runtime, record, "disconnected")
                return AuthorizationOutcome(
                    AuthorizationStatus.DISCONNECTED,
                    record.provider,
                    record.id,
                    reason="client connection closed",
                )
            try:
                await asyncio.wait_for(events.get(), timeout=min(POLL_SECONDS, remaining))
            except TimeoutError:
                pass

    async def _outcome_of(self, elicitation_id: str, record: ElicitationRecord | None = None) -> AuthorizationOutcome:
        record = record or await self.runtime.store.elicitations.get(elicitation_id)
        assert record is not None
        status = _TERMINAL_OUTCOMES.get(record.status, AuthorizationStatus.FAILED)
        grant = None
        if status is AuthorizationStatus.AUTHORIZED:
            delivery = self._deliveries.get(elicitation_id)
            if delivery is not None:  # let elicitation/complete reach the client before the work resumes
                await asyncio.shield(delivery)
            found = await self.tokens.find_grant(record.identity, record.provider, record.scopes)
            grant = GrantInfo.of(found) if found is not None else None
        return AuthorizationOutcome(status, record.provider, record.id, grant=grant, reason=record.failure_reason)

    def _on_event(self, event: ElicitationEvent) -> None:
        if event.status is not ElicitationStatus.COMPLETED:
            return
        link = self._links_by_key.get(event.connection_key)
        if link is None:
            log.info(
                "originating connection is gone; elicitation/complete not sent",
                extra={"elicitation_id": event.elicitation_id},
            )
            return
        # Exactly once: only the single winning transition to COMPLETED publishes this event.
        task = asyncio.get_running_loop().create_task(self._deliver(link, event.elicitation_id))
        self._deliveries[event.elicitation_id] = task
        task.add_done_callback(lambda _t: self._deliveries.pop(event.elicitation_id, None))

    async def _deliver(self, link: AcpLink, elicitation_id: str) -> None:
        sent = await send_completion(link, elicitation_id)
        await self.runtime.store.audit.record(
            "completion_sent" if sent else "completion_undeliverable",
            elicitation_id=elicitation_id,
            now=self.runtime.now(),
        )


__all__ = [
    "AuthorizationOutcome",
    "AuthorizationStatus",
    "Connector",
    "GrantInfo",
]
