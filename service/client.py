"""A Python agent's client of a sidecar connector: the embedded API's calls, backed by the `/v1` HTTP API.

`SidecarClient.request_authorization(conn, ...)` takes the same arguments and returns the same outcomes as
`Connector.request_authorization`, but the connector runs elsewhere: the sidecar creates and tracks the
elicitation and holds the tokens; this client sends `elicitation/create` and `elicitation/complete` on the
agent's own ACP connection (it keeps the connection, the sidecar keeps the secrets), reports the client's answer,
waits on the sidecar (long-poll), and sends `$/cancel_request` and foreground state like the embedded connector.
`http(user, provider)` calls the provider's API through the sidecar's token proxy.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import httpx

from .acp import AcpLink, AgentConnection, StateListener, url_mode_advertised
from .acp.adapter import SdkConnection
from .acp.authorizer import INITIALIZE_WAIT_SECONDS, stop_cause
from .acp.foreground import ForegroundTracker
from .acp.messages import send_completion, send_url_elicitation
from .core.errors import ConnectorError
from .core.identity import Identity
from .core.lifecycle import AnswerKind, ClientAnswer, covers
from .core.outcomes import (
    CLIENT_DISCONNECTED,
    NARROWED_BEFORE,
    AuthorizationOutcome,
    AuthorizationStatus,
    GrantInfo,
)
from .core.scopes import ElicitationScope, SessionScope
from .core.webhooks import WebhookVerificationError, verify_webhook

# How long one long-poll asks the sidecar to hold; between polls the client checks its ACP connection.
WAIT_SECONDS = 10.0
_ANSWER_ACTIONS = {
    AnswerKind.ACCEPT: "accept",
    AnswerKind.DECLINE: "decline",
    AnswerKind.CANCEL: "cancel",
    AnswerKind.ERROR: "client_error",
    AnswerKind.DISCONNECTED: "disconnected",
}


class SidecarError(ConnectorError):
    """The sidecar refused a call: `code` is its stable error code."""


class SidecarClient:
    """One agent's client of a sidecar at `base_url`, authenticated by an API key."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(timeout, read=timeout + WAIT_SECONDS),
        )
        self.foreground = ForegroundTracker()

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> SidecarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the agent's API (as `Connector`) -------------------------------------------------------------------
    def attach(self, conn: AgentConnection, *, on_state: StateListener | None = None) -> AcpLink:
        """Start tracking a client connection; call it from the agent's `on_connect`, before `initialize`."""
        link = SdkConnection.installed(conn)
        if not isinstance(link, AcpLink):
            link = AcpLink(conn, on_closed=self.foreground.forget)
        if not link.closed:
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
        ask_again: bool = False,
    ) -> AuthorizationOutcome:
        """As `Connector.request_authorization`. Raises `SidecarError` when the sidecar refuses the request."""
        attached_before = SdkConnection.installed(conn) is not None
        link = self.attach(conn)
        wait = INITIALIZE_WAIT_SECONDS if attached_before else 0.0
        capabilities = await link.client_capabilities(client_capabilities, wait)
        if link.closed:
            return AuthorizationOutcome(AuthorizationStatus.DISCONNECTED, provider, reason=CLIENT_DISCONNECTED)
        if not url_mode_advertised(capabilities):
            return await self._without_url_mode(user, provider, scopes)
        body = _create_body(user, provider, scopes, scope, message, link.key)
        if ask_again:
            body["askAgain"] = True
        created = await self._call("POST", "/v1/elicitations", json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
        if created["status"] in ("already_authorized", "narrowed"):
            narrowed = created["status"] == "narrowed"
            return AuthorizationOutcome(
                AuthorizationStatus.NARROWED if narrowed else AuthorizationStatus.ALREADY_AUTHORIZED,
                provider,
                grant=_grant(created["grant"]),
                reason=NARROWED_BEFORE if narrowed else None,
                provider_display_name=created["providerDisplayName"],
                refused_scopes=tuple(created.get("refusedScopes", ())),
            )
        elicitation_id = created["elicitationId"]
        blocking = foreground and isinstance(scope, SessionScope)
        session_id = scope.session_id if isinstance(scope, SessionScope) else ""
        if blocking:
            await self.foreground.block(link, session_id)
        resumes = True
        try:
            outcome = await self._run(link, created, scope)
            resumes = outcome.status is not AuthorizationStatus.DISCONNECTED
            return outcome
        except asyncio.CancelledError:
            resumes = not stop_cause(link, scope).ends_the_work
            await asyncio.shield(self._cancelled(link, elicitation_id))
            raise
        finally:
            if blocking:
                await self.foreground.unblock(link, session_id, ended=not resumes)

    async def _run(self, link: AcpLink, created: Mapping[str, Any], scope: ElicitationScope) -> AuthorizationOutcome:
        """Ask the client, report its answer, wait for the end, and send `elicitation/complete` when authorized."""
        elicitation_id = created["elicitationId"]
        ask = asyncio.ensure_future(
            send_url_elicitation(
                link, elicitation_id=elicitation_id, url=created["url"], message=created["message"], scope=scope
            )
        )
        try:
            # The elicitation may end before the client answers (its time, the browser being faster).
            state = await self._until(ask, elicitation_id)
        finally:
            ask.cancel()
        if state is not None:
            await link.withdraw(elicitation_id)  # the question is no longer relevant to the client
            return _outcome(state, None)
        answer = ask.result()
        state = await self._call("POST", f"/v1/elicitations/{elicitation_id}/answer", json=_answer_body(answer))
        if answer.kind is AnswerKind.ACCEPT:
            state = await self._await_browser(link, elicitation_id, state)
        outcome = _outcome(state, answer.error_code)
        if outcome.status is AuthorizationStatus.AUTHORIZED:
            await send_completion(link, elicitation_id)
        return outcome

    async def _until(self, ask: asyncio.Future[ClientAnswer], elicitation_id: str) -> dict[str, Any] | None:
        """None once the client answered; the state if the elicitation ended first."""
        while not ask.done():
            poll = asyncio.ensure_future(
                self._call("GET", f"/v1/elicitations/{elicitation_id}", params={"wait": str(WAIT_SECONDS)})
            )
            waiting: set[asyncio.Future[Any]] = {ask, poll}
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not poll.done():
                    poll.cancel()
            if not ask.done() and poll.done() and poll.result()["outcome"] is not None:
                return poll.result()
        return None

    async def _await_browser(self, link: AcpLink, elicitation_id: str, state: dict[str, Any]) -> dict[str, Any]:
        while state["outcome"] is None:
            if link.closed:
                # As embedded: nobody waits any more; a flow the user already took to the provider still stores
                # its grant, nothing is sent.
                await self._cancel(elicitation_id)
                return {**state, "outcome": AuthorizationStatus.DISCONNECTED.value, "reason": CLIENT_DISCONNECTED}
            poll = asyncio.ensure_future(
                self._call("GET", f"/v1/elicitations/{elicitation_id}", params={"wait": str(WAIT_SECONDS)})
            )
            closed = asyncio.ensure_future(link.wait_closed())
            both: set[asyncio.Future[Any]] = {poll, closed}
            try:
                await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            finally:
                closed.cancel()
                if not poll.done():
                    poll.cancel()
            if poll.done():
                state = poll.result()
        return state

    async def find_grant(self, user: Identity, provider: str, scopes: Sequence[str] = ()) -> GrantInfo | None:
        grants = await self._call(
            "GET", "/v1/grants", params={"issuer": user.issuer, "subject": user.subject, "provider": provider}
        )
        for grant in grants["grants"]:
            if covers(grant["scopes"], scopes):
                return _grant(grant)
        return None

    async def elicitation(self, elicitation_id: str) -> dict[str, Any]:
        """An elicitation's state as the sidecar reports it (never a secret)."""
        return await self._call("GET", f"/v1/elicitations/{elicitation_id}")

    @asynccontextmanager
    async def http(self, user: Identity, provider: str, **client_kwargs: Any) -> AsyncIterator[httpx.AsyncClient]:
        """An httpx client for the provider's API through the sidecar's proxy: the token is injected there."""
        headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Connector-User-Issuer": user.issuer,
            "Connector-User-Subject": user.subject,
        }
        client_kwargs.setdefault("timeout", 60.0)
        async with httpx.AsyncClient(
            base_url=f"{self.base_url}/v1/proxy/{provider}/", headers=headers, **client_kwargs
        ) as client:
            yield client

    async def disconnect(self, user: Identity, provider: str) -> int:
        """Revoke (where the provider allows) and delete every grant of `user` at `provider`."""
        grants = await self._call(
            "GET", "/v1/grants", params={"issuer": user.issuer, "subject": user.subject, "provider": provider}
        )
        for grant in grants["grants"]:
            await self._call("DELETE", f"/v1/grants/{grant['grantId']}")
        return len(grants["grants"])

    # -- steps ----------------------------------------------------------------------------------------------
    async def _without_url_mode(
        self, user: Identity, provider: str, scopes: Sequence[str] | None
    ) -> AuthorizationOutcome:
        """Nothing is sent to a client without URL mode; a stored grant still answers."""
        grant = await self.find_grant(user, provider, scopes or ())
        if grant is not None:
            return AuthorizationOutcome(AuthorizationStatus.ALREADY_AUTHORIZED, provider, grant=grant)
        return AuthorizationOutcome(AuthorizationStatus.UNSUPPORTED, provider)

    async def _cancelled(self, link: AcpLink, elicitation_id: str) -> None:
        """The agent's work stopped: withdraw our unanswered request and cancel the elicitation (see `Connector`)."""
        await link.withdraw(elicitation_id)
        await self._cancel(elicitation_id)

    async def _cancel(self, elicitation_id: str) -> None:
        try:
            await self._call("POST", f"/v1/elicitations/{elicitation_id}/cancel")
        except SidecarError as exc:
            if exc.code != "already_ended":
                raise

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self._http.request(method, path, **kwargs)
        if response.status_code == 204:
            return {}
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 400 or not isinstance(body, dict):
            error = body.get("error", {}) if isinstance(body, dict) else {}
            raise SidecarError(
                error.get("message") or f"the sidecar answered HTTP {response.status_code}",
                code=error.get("code") or f"http_{response.status_code}",
            )
        return body


def _create_body(
    user: Identity,
    provider: str,
    scopes: Sequence[str] | None,
    scope: ElicitationScope,
    message: str | None,
    connection_id: str,
) -> dict[str, Any]:
    where: dict[str, Any] = (
        {"sessionId": scope.session_id, **({"toolCallId": scope.tool_call_id} if scope.tool_call_id else {})}
        if isinstance(scope, SessionScope)
        else {"requestId": scope.request_id}
    )
    body: dict[str, Any] = {
        "user": {"issuer": user.issuer, "subject": user.subject},
        "provider": provider,
        "scope": where,
        "connectionId": connection_id,
    }
    if scopes is not None:
        body["scopes"] = list(scopes)
    if message is not None:
        body["message"] = message
    return body


def _answer_body(answer: ClientAnswer) -> dict[str, Any]:
    body: dict[str, Any] = {"action": _ANSWER_ACTIONS[answer.kind]}
    if body["action"] == "client_error":
        body["code"] = answer.error_code if answer.error_code is not None else -32603
        if answer.message:
            body["message"] = answer.message[:500]
    return body


def _grant(body: Mapping[str, Any]) -> GrantInfo:
    expires = body.get("expiresAt")
    return GrantInfo(
        id=body["grantId"],
        provider=body["provider"],
        account_id=body["accountId"],
        scopes=tuple(body["scopes"]),
        token_expires_at=datetime.fromisoformat(expires) if expires else None,
    )


def _outcome(state: Mapping[str, Any], error_code: int | None) -> AuthorizationOutcome:
    status = AuthorizationStatus(state["outcome"])
    grant = state.get("grant")
    return AuthorizationOutcome(
        status,
        state["provider"],
        state["elicitationId"],
        grant=_grant(grant) if grant else None,
        reason=state.get("reason"),
        error_code=error_code if status is AuthorizationStatus.CLIENT_ERROR else None,
        provider_display_name=state.get("providerDisplayName"),
        refused_scopes=tuple(state.get("refusedScopes", ())),
    )


__all__ = ["SidecarClient", "SidecarError", "WebhookVerificationError", "verify_webhook"]
