"""A Python agent's client of a sidecar connector: the embedded API's calls, backed by the `/v1` HTTP API.

`SidecarClient.request_authorization(conn, ...)` takes the same arguments and returns the same outcomes as
`Connector.request_authorization`, but the connector runs elsewhere: the sidecar creates and tracks the
elicitation and holds the tokens; this client sends `elicitation/create` and `elicitation/complete` on the
agent's own ACP connection (it keeps the connection, the sidecar keeps the secrets), reports the client's answer,
waits on the sidecar (long-poll), and sends `$/cancel_request` and foreground state like the embedded connector.
`http(user, provider)` calls the provider's API through the sidecar's token proxy.

Waiting survives a sidecar restart or a network error: the long-poll (and reporting the client's answer)
is tried again with backoff until the elicitation's `expiresAt`; only then does the call fail, with
`SidecarUnavailable`, whose message says what happened in words a user can read.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from .acp import AcpAuthorizer, AgentCalls, AuthorizationAsk
from .core.accounts import choose
from .core.answers import AnswerKind, ClientAnswer
from .core.coverage import covers
from .core.errors import AccountChoiceNeeded, SidecarError, SidecarUnavailable
from .core.identity import Identity
from .core.outcomes import (
    NARROWED_BEFORE,
    AuthorizationOutcome,
    AuthorizationStatus,
    GrantInfo,
    StopCause,
    refusal_message,
)
from .core.scopes import SessionScope
from .core.webhooks import WebhookVerificationError, verify_webhook
from .faces import CompletionListener

if TYPE_CHECKING:
    from .mcp import McpAuthorizer

# How long one long-poll asks the sidecar to hold (the connection ending wakes the waiting call at once).
WAIT_SECONDS = 10.0
# Backoff between attempts while the sidecar cannot be reached: doubling from the first to the last, with jitter.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0
T = TypeVar("T")
Call = Callable[..., Awaitable[dict[str, Any]]]  # (method, path, **httpx request options) -> the JSON answer
_ANSWER_ACTIONS = {
    AnswerKind.ACCEPT: "accept",
    AnswerKind.DECLINE: "decline",
    AnswerKind.CANCEL: "cancel",
    AnswerKind.ERROR: "client_error",
    AnswerKind.DISCONNECTED: "disconnected",
}


def _unreachable(error: Exception) -> str | None:
    """What went wrong, in words, when `error` means the sidecar could not be reached (None: it answered)."""
    if isinstance(error, httpx.ConnectError):
        return "it refused or dropped the connection"
    if isinstance(error, httpx.TimeoutException):
        return "it did not answer in time"
    if isinstance(error, httpx.TransportError):
        return "the connection to it broke"
    if isinstance(error, SidecarError) and error.code in ("http_502", "http_503", "http_504", "unavailable"):
        return f"it answered {error.code.removeprefix('http_')} (unavailable)"
    return None


def _clock(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%H:%M:%S UTC")


@dataclass(frozen=True, slots=True)
class SidecarElicitation:
    """An elicitation the sidecar created, as the ACP side needs it."""

    id: str
    url: str
    message: str
    connection_key: str  # the agent's `AcpLink.key`, sent as `connectionId`
    expires_at: datetime  # until then a sidecar that cannot be reached is tried again


State = dict[str, Any]  # an elicitation's state as `GET /v1/elicitations/{id}` answers it


class SidecarLifecycle:
    """`Lifecycle[SidecarElicitation, State]` over the `/v1` API: the sidecar keeps the elicitations and grants.

    The waiting call is the only one here that learns of a completion, so it tells it itself (once).
    """

    def __init__(self, call: Call, base_url: str = "the sidecar") -> None:
        self._call = call
        self._base_url = base_url
        self._display_names: dict[str, str] = {}

    def display_name(self, provider: str) -> str | None:
        return self._display_names.get(provider)

    async def settled(self, ask: AuthorizationAsk) -> AuthorizationOutcome | None:
        answer = await self._call("POST", "/v1/elicitations", json={**_create_body(ask, None), "grantsOnly": True})
        return self._settled(ask.provider, answer)

    async def unsupported(self, ask: AuthorizationAsk) -> None:
        """Have the sidecar record it (`urlMode: false` creates nothing): its audit log then reads as the embedded
        connector's."""
        await self._call("POST", "/v1/elicitations", json={**_create_body(ask, None), "urlMode": False})

    async def create(self, ask: AuthorizationAsk, connection_key: str) -> SidecarElicitation | AuthorizationOutcome:
        created = await self._call(
            "POST",
            "/v1/elicitations",
            json=_create_body(ask, connection_key),
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        settled = self._settled(ask.provider, created)
        if settled is not None:
            return settled
        expires_at = datetime.fromisoformat(created["expiresAt"])
        return SidecarElicitation(
            created["elicitationId"], created["url"], created["message"], connection_key, expires_at
        )

    def _settled(self, provider: str, answer: Mapping[str, Any]) -> AuthorizationOutcome | None:
        self._display_names[provider] = answer["providerDisplayName"]
        if answer["status"] not in ("already_authorized", "narrowed"):
            return None
        narrowed = answer["status"] == "narrowed"
        return AuthorizationOutcome(
            AuthorizationStatus.NARROWED if narrowed else AuthorizationStatus.ALREADY_AUTHORIZED,
            provider,
            grant=_grant(answer["grant"]),
            reason=NARROWED_BEFORE if narrowed else None,
            provider_display_name=answer["providerDisplayName"],
            refused_scopes=tuple(answer.get("refusedScopes", ())),
        )

    def url(self, handle: SidecarElicitation) -> str:
        return handle.url

    @contextmanager
    def waiter(self, handle: SidecarElicitation) -> Iterator[asyncio.Future[State | None]]:
        """Long-polls the sidecar until the elicitation has ended (the connection ending wakes it with None)."""
        ended: asyncio.Future[State | None] = asyncio.get_running_loop().create_future()
        polling = asyncio.ensure_future(self._poll(handle, ended))
        try:
            yield ended
        finally:
            polling.cancel()

    async def _poll(self, handle: SidecarElicitation, ended: asyncio.Future[State | None]) -> None:
        path = f"/v1/elicitations/{handle.id}"
        try:
            while not ended.done():
                state = await self._until_expiry(
                    handle, lambda: self._call("GET", path, params={"wait": str(WAIT_SECONDS)})
                )
                if state["outcome"] is not None and not ended.done():
                    ended.set_result(state)
        except Exception as exc:
            if not ended.done():
                ended.set_exception(exc)

    async def _until_expiry(self, handle: SidecarElicitation, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()`, tried again with backoff while the sidecar cannot be reached, until the elicitation's
        expiry; then `SidecarUnavailable`. An answer of the sidecar (also a refusal) ends the retrying."""
        delay = RETRY_FIRST_SECONDS
        down_since: datetime | None = None
        while True:
            try:
                return await attempt()
            except (httpx.TransportError, SidecarError) as exc:
                what = _unreachable(exc)
                if what is None:
                    raise
                now = datetime.now(UTC)
                down_since = down_since or now
                if now >= handle.expires_at:
                    raise SidecarUnavailable(
                        f"The connector at {self._base_url} could not be reached since {_clock(down_since)} ({what}),"
                        f" and the request for access expired at {_clock(handle.expires_at)}: the authorization"
                        " did not complete. Ask again once the connector is back."
                    ) from exc
                remaining = (handle.expires_at - now).total_seconds()
                await asyncio.sleep(min(delay * random.uniform(0.5, 1.0), remaining))  # noqa: S311 - jitter
                delay = min(delay * 2, RETRY_MAX_SECONDS)

    def kept(self, handle: SidecarElicitation) -> SidecarElicitation:
        return handle  # the long-poll holds it whole

    async def answered(self, handle: SidecarElicitation, answer: ClientAnswer) -> AuthorizationOutcome | None:
        path = f"/v1/elicitations/{handle.id}"
        retried = False

        async def report() -> State:
            nonlocal retried
            try:
                return await self._call("POST", f"{path}/answer", json=_answer_body(answer))
            except SidecarError as exc:
                if retried and exc.code == "already_answered":  # an attempt whose answer was lost got through
                    return await self._call("GET", path)
                raise
            finally:
                retried = True

        state = await self._until_expiry(handle, report)
        if answer.kind is AnswerKind.ACCEPT:
            return None
        return _outcome(state, answer.error_code)

    async def outcome_of_end(self, handle: SidecarElicitation, end: State) -> AuthorizationOutcome:
        return _outcome(end, None)

    async def cancel(
        self, handle: SidecarElicitation, cause: StopCause, *, request_cancelled: bool | None = None
    ) -> bool:
        body: dict[str, Any] = {"cause": cause.value}
        if request_cancelled is not None:
            body["requestCancelled"] = request_cancelled
        try:
            await self._call("POST", f"/v1/elicitations/{handle.id}/cancel", json=body)
        except SidecarError as exc:
            if exc.code != "already_ended":
                raise
            return False
        return True

    async def current_outcome(self, handle: SidecarElicitation) -> AuthorizationOutcome:
        return _outcome(await self._call("GET", f"/v1/elicitations/{handle.id}"), None)

    async def tell_completion(self, elicitation_id: str, send: Callable[[], Awaitable[bool]]) -> None:
        await send()

    def on_completed(self, listener: CompletionListener) -> None:
        return None  # the sidecar's events are not followed here: the waiting call tells its own completion


class SidecarClient(AgentCalls):
    """One agent's client of a sidecar at `base_url`, authenticated by an API key."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(timeout, read=timeout + WAIT_SECONDS),
        )
        self._authorizer = AcpAuthorizer(SidecarLifecycle(self._call, self.base_url))
        self._mcp: McpAuthorizer[SidecarElicitation, State] | None = None

    async def close(self) -> None:
        await self._authorizer.close()
        if self._mcp is not None:
            await self._mcp.close()
        await self._http.aclose()

    @property
    def mcp(self) -> McpAuthorizer[SidecarElicitation, State]:
        """The MCP face over this sidecar, for MCP servers on the official `mcp` SDK (the `[mcp]` extra): in a tool,
        `await sidecar.mcp.request_authorization(ctx, user=..., provider=...)` (or `require_authorization`)."""
        if self._mcp is None:
            from .mcp import McpAuthorizer

            self._mcp = McpAuthorizer(SidecarLifecycle(self._call, self.base_url))
        return self._mcp

    async def __aenter__(self) -> SidecarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the agent's API (attach, request_authorization: `AgentCalls`, as `Connector`) ------------------------
    @property
    def authorizer(self) -> AcpAuthorizer[SidecarElicitation, State]:
        return self._authorizer

    async def find_grant(
        self, user: Identity, provider: str, scopes: Sequence[str] = (), *, account: str | None = None
    ) -> GrantInfo | None:
        """As `Connector.find_grant`: of the account `account` names; AccountChoiceNeeded without it when the user
        holds several accounts at the provider."""
        listed = await self._call(
            "GET", "/v1/grants", params={"issuer": user.issuer, "subject": user.subject, "provider": provider}
        )
        found = choose([_grant(grant) for grant in listed["grants"]], account, provider)
        return next((grant for grant in found if covers(grant.scopes, scopes)), None)

    async def elicitation(self, elicitation_id: str) -> dict[str, Any]:
        """An elicitation's state as the sidecar reports it (never a secret)."""
        return await self._call("GET", f"/v1/elicitations/{elicitation_id}")

    @asynccontextmanager
    async def http(
        self, user: Identity, provider: str, *, account: str | None = None, **client_kwargs: Any
    ) -> AsyncIterator[httpx.AsyncClient]:
        """An httpx client for the provider's API through the sidecar's proxy: the token is injected there.
        `account` (an account id or label) names which of the user's accounts there; without it, a user holding
        several gets the sidecar's 409 `account_choice_needed` (its `error.labels` name them) on each request."""
        headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Connector-User-Issuer": user.issuer,
            "Connector-User-Subject": user.subject,
        }
        if account is not None:
            headers["Connector-Account"] = account
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
            if error.get("code") == AccountChoiceNeeded.code and isinstance(error.get("labels"), list):
                raise AccountChoiceNeeded("", [str(label) for label in error["labels"]], error.get("message"))
            raise SidecarError(
                error.get("message") or f"the sidecar answered HTTP {response.status_code}",
                code=error.get("code") or f"http_{response.status_code}",
            )
        return body


def _create_body(ask: AuthorizationAsk, connection_id: str | None) -> dict[str, Any]:
    scope = ask.scope
    where: dict[str, Any] = (
        {"sessionId": scope.session_id, **({"toolCallId": scope.tool_call_id} if scope.tool_call_id else {})}
        if isinstance(scope, SessionScope)
        else {"requestId": scope.request_id}
    )
    body: dict[str, Any] = {
        "user": {"issuer": ask.user.issuer, "subject": ask.user.subject},
        "provider": ask.provider,
        "scope": where,
    }
    if connection_id is not None:
        body["connectionId"] = connection_id
    if ask.scopes is not None:
        body["scopes"] = list(ask.scopes)
    if ask.message is not None:
        body["message"] = ask.message
    if ask.ask_again:
        body["askAgain"] = True
    if ask.connection:
        body["connection"] = dict(ask.connection)
    if ask.account is not None:
        body["account"] = ask.account
    return body


def _answer_body(answer: ClientAnswer) -> dict[str, Any]:
    body: dict[str, Any] = {"action": _ANSWER_ACTIONS[answer.kind]}
    if answer.kind is AnswerKind.CANCEL and answer.client_message:
        body["message"] = answer.client_message[:500]  # the client's reason: a refusal, not a dismissal
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
        account_label=body.get("accountLabel"),
        account_name=body.get("accountName"),
    )


def _outcome(state: Mapping[str, Any], error_code: int | None) -> AuthorizationOutcome:
    status = AuthorizationStatus(state["outcome"])
    grant = state.get("grant")
    reason = state.get("reason")
    return AuthorizationOutcome(
        status,
        state["provider"],
        state["elicitationId"],
        grant=_grant(grant) if grant else None,
        reason=reason,
        error_code=error_code if status is AuthorizationStatus.CLIENT_ERROR else None,
        client_message=refusal_message(reason) if status is AuthorizationStatus.REFUSED else None,
        provider_display_name=state.get("providerDisplayName"),
        refused_scopes=tuple(state.get("refusedScopes", ())),
    )


__all__ = ["SidecarClient", "SidecarError", "SidecarUnavailable", "WebhookVerificationError", "verify_webhook"]
