"""The embedded API an agent calls: request authorization over ACP, use a grant, disconnect.

An agent builds one `Connector`, serves its web routes (`serve()` or `asgi_app()`), and for each tool that needs
a provider calls `request_authorization(...)` with its ACP connection. Tokens never come back. `Connector` is a
thin facade: the work is done by the parts `service.app` wires (`runtime`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .acp import AcpLink, AgentConnection, StateListener
from .config import Settings, load_settings
from .core.clock import Clock
from .core.errors import NotAuthorized
from .core.identity import Identity
from .core.outcomes import AuthorizationOutcome, GrantInfo
from .core.records import ElicitationRecord
from .core.scopes import ElicitationScope
from .tokens import GrantAuth

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .app import Runtime
    from .identity import IdentityVerifier


class Connector:
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
        from .web.server import serve

        server = self.settings.server
        listeners = [serve(self.asgi_app(), server.host, server.port)]
        metrics = self.metrics_asgi_app()
        if metrics is not None:
            assert self.settings.metrics.port is not None
            listeners.append(serve(metrics, self.settings.metrics.host, self.settings.metrics.port))
        await asyncio.gather(*listeners)

    # -- the agent's API -------------------------------------------------------------------------------------
    def attach(self, conn: AgentConnection, *, on_state: StateListener | None = None) -> AcpLink:
        """Start tracking a client connection. Call it from the agent's `on_connect`, before `initialize`.

        The connector then sees every message of the connection: it reads the client's capabilities (v1
        `clientCapabilities` or v2 `capabilities`) and the negotiated protocol version, refuses malformed messages
        before the SDK sees them, can cancel its own pending requests with `$/cancel_request`, answers the client's
        `$/cancel_request`, and notices at once when the connection ends (everything it kept for the connection is
        dropped then). `on_state(session_id, state)` hears foreground-state transitions (on v2 connections they are
        also sent as `state_update`). Raises `AcpSdkUnsupported` when the installed `acp` SDK is not a version the
        connector was written for, or `conn` is not the SDK's agent-side connection.
        """
        return self.runtime.acp.attach(conn, on_state=on_state)

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
        ask_again: bool = False,
    ) -> AuthorizationOutcome:
        """Make sure `user` holds a grant at `provider` covering `scopes`, asking through the client if needed.

        The client's capabilities come from its `initialize` on the wire when the connection was attached in
        `on_connect`; if the client has not sent `initialize` yet, this waits for it (at most 10 s) and then raises
        `ClientNotInitialized`. On a connection attached only now (too late to see `initialize`) pass
        `client_capabilities` (SDK model or raw JSON); without them this raises `ClientNotInitialized` at once.
        `foreground=False` marks a request for background activity: it changes no session's foreground state.

        When the provider grants fewer scopes than asked, the outcome is `narrowed`: `refused_scopes` names the
        others and `grant` is the stored grant. Asking again for scopes the provider refused is answered the same
        way at once, without a new `elicitation/create`, unless `ask_again=True` (e.g. after the user said so).

        Returns when the grant exists, or with the reason it does not (`AuthorizationOutcome.status`). If the calling
        task is cancelled (a timeout of yours, `session/cancel`, the client's `$/cancel_request`), the pending
        `elicitation/create` is withdrawn with `$/cancel_request`, the elicitation ends as cancelled, and
        `CancelledError` propagates; nothing resumes the cancelled work. Raises `ProviderNotConfigured` or
        `UnknownProvider` for a provider the operator has not set up.
        """
        entry = self.runtime.providers.require_configured(provider)
        return await self.runtime.acp.request_authorization(
            conn,
            client_capabilities,
            user=user,
            provider=entry.name,
            scopes=tuple(scopes) if scopes is not None else tuple(entry.default_scopes),
            scope=scope,
            message=message,
            foreground=foreground,
            ask_again=ask_again,
        )

    async def find_grant(self, user: Identity, provider: str, scopes: Sequence[str] = ()) -> GrantInfo | None:
        grant = await self.runtime.elicitations.find_grant(user, provider, scopes)
        return GrantInfo.of(grant) if grant is not None else None

    async def elicitation(self, elicitation_id: str) -> ElicitationRecord | None:
        """An elicitation as stored (its status, scope and times; never a secret)."""
        return await self.runtime.elicitations.get(elicitation_id)

    @asynccontextmanager
    async def http(
        self, user: Identity, provider: str, *, scopes: Sequence[str] = (), **client_kwargs: Any
    ) -> AsyncIterator[httpx.AsyncClient]:
        """An httpx client for the provider's API with the user's token injected (and refreshed) server-side.

        Requests to any other host are refused before they are sent, so the token cannot be steered elsewhere.
        The client runs over the provider's long-lived connection pool, so opening one per call is cheap;
        `client_kwargs` are httpx client options (`timeout`, `headers`, ...), except those of a connection pool
        (`verify`, `limits`, `http2`, ...), which `[providers]` sets once for all.
        """
        runtime = self.runtime
        resolved = await runtime.providers.resolve(provider)
        grant = await runtime.tokens.grant_for(user, provider, scopes)
        if grant is None:
            raise NotAuthorized(f"{user} has no {resolved.display_name} grant with scopes {list(scopes)}")
        auth = GrantAuth(runtime.tokens, grant.id, resolved)
        async with runtime.providers.api_client(resolved, auth=auth, client_kwargs=client_kwargs) as client:
            yield client

    async def disconnect(self, user: Identity, provider: str) -> int:
        """Revoke (where the provider allows) and delete every grant of `user` at `provider`."""
        return await self.runtime.tokens.disconnect(user, provider)


__all__ = ["Connector"]
