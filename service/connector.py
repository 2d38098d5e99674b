"""The embedded API an agent calls: request authorization over ACP, use a grant, disconnect.

An agent builds one `Connector`, serves its web routes (`serve()` or `asgi_app()`), and for each tool that needs
a provider calls `request_authorization(...)` with its ACP connection (an MCP server: `mcp.request_authorization(ctx,
...)` in its tool). Tokens never come back. `Connector` is a
thin facade: the work is done by the parts `service.app` wires (`runtime`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .acp import AcpAuthorizer, AgentCalls
from .config import Settings, load_settings
from .core.errors import NotAuthorized
from .core.events import ElicitationEvent, Event, GrantEvent
from .core.identity import Identity
from .core.outcomes import GrantInfo
from .core.records import ElicitationRecord
from .core.tenants import EMBEDDED_TENANT
from .tokens import grant_auth, secret_headers, unreadable_error
from .util.clock import Clock

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .app import Runtime
    from .identity import IdentityVerifier
    from .mcp import McpAuthorizer


class Connector(AgentCalls):
    """One connector instance: its database, vault, provider catalog and web routes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    # -- construction --------------------------------------------------------------------------------------
    @classmethod
    def from_settings(cls, settings: Settings) -> Connector:
        """Wire a connector. Raises ConfigError when the settings cannot work (a key, a verifier's section...)."""
        from .app import build_runtime

        return cls(build_runtime(settings))

    @classmethod
    def from_config(cls, path: str | Path | None = None) -> Connector:
        return cls.from_settings(load_settings(path))

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def verifier(self) -> IdentityVerifier:
        """The configured identity verifier (`identity.verifier`)."""
        return self.runtime.verifier

    @property
    def clock(self) -> Clock:
        """This connector's time (tests may `advance` it)."""
        return self.runtime.clock

    async def start(self) -> None:
        """Refuse to run on an unmigrated or newer-schema database."""
        await self.runtime.start()

    async def close(self) -> None:
        await self.runtime.close()

    async def __aenter__(self) -> Connector:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def asgi_app(self) -> Starlette:
        from .app import build_web_app

        return build_web_app(self.runtime)

    def metrics_asgi_app(self) -> Starlette | None:
        """The app of the separate metrics listener, when `metrics.port` is set (else None: see `[metrics]`)."""
        from .app import build_metrics_app

        return build_metrics_app(self.runtime)

    async def serve(self) -> None:
        """Serve the web routes on the configured host and port (and the metrics on theirs) until cancelled."""
        from .app import serve_runtime

        await serve_runtime(self.runtime)

    # -- the agent's API (attach, request_authorization: `AgentCalls`) ----------------------------------------
    @property
    def authorizer(self) -> AcpAuthorizer[ElicitationRecord, ElicitationEvent]:
        return self.runtime.acp

    @property
    def mcp(self) -> McpAuthorizer[ElicitationRecord, ElicitationEvent]:
        """The MCP face, for MCP servers on the official `mcp` SDK (the `[mcp]` extra): in a tool,
        `await connector.mcp.request_authorization(ctx, user=..., provider=...)` (or `require_authorization` for
        the `-32042` path). Default scopes come from the catalog, as for ACP."""
        return self.runtime.mcp(self.requested)

    def requested(self, provider: str, scopes: Sequence[str] | None) -> tuple[str, Sequence[str]]:
        """The catalog's name and, when none are given, default scopes (`ProviderNotConfigured`, `UnknownProvider`)."""
        entry = self.runtime.providers.require_configured(provider)
        return entry.name, tuple(scopes) if scopes is not None else tuple(entry.default_scopes)

    async def find_grant(
        self, user: Identity, provider: str, scopes: Sequence[str] = (), *, account: str | None = None
    ) -> GrantInfo | None:
        """The user's grant at `provider` covering `scopes` (of the account `account` names: an account id or a label;
        without it, `AccountChoiceNeeded` when the user holds several accounts there), or None."""
        grant = await self.runtime.elicitations.find_grant(user, provider, scopes, EMBEDDED_TENANT, account=account)
        return GrantInfo.of(grant) if grant is not None else None

    async def elicitation(self, elicitation_id: str) -> ElicitationRecord | None:
        """An elicitation as stored (its status, scope and times; never a secret)."""
        return await self.runtime.elicitations.get(elicitation_id)

    @asynccontextmanager
    async def http(
        self,
        user: Identity,
        provider: str,
        *,
        scopes: Sequence[str] = (),
        account: str | None = None,
        **client_kwargs: Any,
    ) -> AsyncIterator[httpx.AsyncClient]:
        """An httpx client for the provider's API with the user's token injected (and refreshed) server-side, or,
        for a credential entry (an API key), its values as the catalog entry says (a 401 then marks the grant
        `needs_user` and raises GrantNeedsUser).

        `account` names which of the user's accounts at the provider to use: the provider's account id, or the label
        the user gave it (or its profile name). Without it, the user's one account there is used; a user holding
        several raises `AccountChoiceNeeded` (naming them by label). NotAuthorized when no grant answers.

        Requests to any other host are refused before they are sent, and a redirect followed to another host goes
        without the token (nor the API's own token header, nor a key's), so the token cannot be steered elsewhere.
        The client runs over the provider's long-lived connection pool, so opening one per call is cheap;
        `client_kwargs` are httpx client options (`timeout`, `headers`, ...), except those of a connection pool
        (`verify`, `limits`, `http2`, ...), which `[providers]` sets once for all.
        """
        runtime = self.runtime
        resolved = await runtime.providers.resolve(provider)
        grant = await runtime.tokens.grant_for(
            user, provider, scopes, self._tenants_seen, account=account, display_name=resolved.display_name
        )
        if grant is None:
            which = "" if account is None else " for that account"
            raise NotAuthorized(f"{user} has no {resolved.display_name} grant{which} with scopes {list(scopes)}")
        if grant.token_key_id not in runtime.vault.ring:  # the operator's to fix: said before any request
            raise unreadable_error(grant, runtime.vault)
        resolved = runtime.tokens.bound(grant, resolved)  # the API base may be the grant's (an instance URL)
        auth = grant_auth(runtime.tokens, grant.id, resolved)
        secrets = secret_headers(resolved)
        async with runtime.providers.api_client(
            resolved, auth=auth, secret_headers=secrets, client_kwargs=client_kwargs
        ) as client:
            yield client

    async def disconnect(self, user: Identity, provider: str) -> int:
        """Revoke (where the provider allows) and delete every grant of `user` at `provider` this connector sees
        (its own tenant's, and those shared with it)."""
        return await self.runtime.tokens.disconnect(user, provider, self._tenants_seen)

    @property
    def _tenants_seen(self) -> frozenset[str]:
        """The tenants whose grants the embedded connector sees: its own (`embedded`) and those shared with it."""
        return self.runtime.elicitations.sharing.visible(EMBEDDED_TENANT)

    def on_grant_event(self, callback: Callable[[GrantEvent], None]) -> Callable[[], None]:
        """Call `callback` (synchronously, on the event loop) with every grant event this process hears:
        `grant.needs_user` (with its reason), `grant.recovered`, `grant.revoked`, `grant.deleted`; ids and reason
        codes, never a token. Events another replica logged arrive while this process reads the event log (with
        PostgreSQL's bus, when it is told of them). Returns the function that stops the calls."""

        seen = self._tenants_seen

        def heard(event: Event) -> None:
            # Only grants this connector sees (an event logged before tenants, with none, is everyone's).
            if isinstance(event, GrantEvent) and (event.tenant is None or event.tenant in seen):
                callback(event)

        self.runtime.bus.add_listener(heard)
        return lambda: self.runtime.bus.remove_listener(heard)

    async def grant_events(self) -> AsyncIterator[GrantEvent]:
        """The grant events of `on_grant_event`, as an async iterator (from now on, until the loop stops)."""
        queue: asyncio.Queue[GrantEvent] = asyncio.Queue()
        stop = self.on_grant_event(queue.put_nowait)
        try:
            while True:
                yield await queue.get()
        finally:
            stop()


__all__ = ["Connector"]
