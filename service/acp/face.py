"""The agent's two ACP calls, declared once for both faces: `attach` and `request_authorization`.

`Connector` (embedded) and `SidecarClient` (backed by a sidecar) are both `AgentCalls`: the same signature, the
same documentation and the same `AcpAuthorizer` behind them; each face only names its authorizer and may resolve
what was asked (the embedded connector fills in the provider's default scopes from its own catalog).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from service.core.identity import Identity
from service.core.outcomes import AuthorizationOutcome
from service.core.scopes import ElicitationScope

from .adapter import AgentConnection
from .authorizer import AcpAuthorizer
from .link import AcpLink, StateListener


class AgentCalls(ABC):
    @property
    @abstractmethod
    def authorizer(self) -> AcpAuthorizer[Any, Any]:
        """The ACP side of this face."""

    def requested(self, provider: str, scopes: Sequence[str] | None) -> tuple[str, Sequence[str] | None]:
        """The provider and scopes to ask for (None: the provider's defaults, resolved by the lifecycle)."""
        return provider, scopes

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
        return self.authorizer.attach(conn, on_state=on_state)

    def request_authorization(
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
        connection: Mapping[str, str] | None = None,
        account: str | None = None,
    ) -> Coroutine[Any, Any, AuthorizationOutcome]:
        """Make sure `user` holds a grant at `provider` covering `scopes`, asking through the client if needed.

        A stored grant that settles the request answers at once, before anything about the client is looked at.
        The client's capabilities come from its `initialize` on the wire when the connection was attached in
        `on_connect`; if the client has not sent `initialize` yet, this waits for it (at most 10 s) and then raises
        `ClientNotInitialized`. On a connection attached only now (too late to see `initialize`) pass
        `client_capabilities` (SDK model or raw JSON); without them this raises `ClientNotInitialized` at once.
        `foreground=False` marks a request for background activity: it changes no session's foreground state.

        When the provider grants fewer scopes than asked, the outcome is `narrowed`: `refused_scopes` names the
        others and `grant` is the stored grant. Asking again for scopes the provider refused is answered the same
        way at once, without a new `elicitation/create`, unless `ask_again=True` (e.g. after the user said so).
        For an API-key provider (a credential entry of the catalog) `ask_again=True` asks for a new key although
        one is stored: the one the user types replaces it.

        `connection` gives the per-connection values the provider's catalog entry asks of the agent (e.g.
        `{"subdomain": "acme"}` for a shop, `{"tenant": "contoso.onmicrosoft.com"}`); they fill the provider's
        URLs and are stored with the grant. A missing or malformed one is refused (`FlowRefused`
        `missing_connection_value` / `invalid_connection_value`, naming it) before anything is asked.

        `account` names which of the user's accounts at the provider is meant (work and personal GitHub): the
        provider's account id, or the label the user gave it on the consent page (or its profile name). Without it, a
        user holding one account there is answered as above, and one holding several raises `AccountChoiceNeeded`
        (its `labels` name them) rather than one being chosen for them. An account the user does not hold yet starts
        an elicitation for a new one (the provider is asked to let the user pick the account, and the consent page
        offers `account` as its name), even when another account already covers the scopes.

        Returns when the grant exists, or with the reason it does not (`AuthorizationOutcome.status`). If the calling
        task is cancelled (a timeout of yours, `session/cancel`, the client's `$/cancel_request`), the pending
        `elicitation/create` is withdrawn with `$/cancel_request`, the elicitation ends as cancelled, and
        `CancelledError` propagates; nothing resumes the cancelled work. Raises `ProviderNotConfigured` or
        `UnknownProvider` for a provider the operator has not set up (`SidecarClient`: `SidecarError` with that
        code, or with the code of whatever else the sidecar refused).
        """
        # The authorizer's coroutine itself, not one awaiting it: a frame less for every call that waits (thousands
        # may wait at once). What was asked is resolved in it, so its errors still come from the await.
        return self.authorizer.request_authorization(
            conn,
            client_capabilities,
            user=user,
            provider=provider,
            scopes=scopes,
            scope=scope,
            message=message,
            foreground=foreground,
            ask_again=ask_again,
            connection=connection,
            account=account,
            resolve=self.requested,
        )
