"""`AcpLink`: one client connection as the connector sees it.

It hears every message of the connection (it is the `WireListener` of the connection's `GuardedTransport`): the raw
`initialize` params (v1 `clientCapabilities`, v2 `capabilities`) and the negotiated protocol version, the JSON-RPC id
of each of our pending `elicitation/create` requests (so a withdrawn one can be named in `$/cancel_request`), which
sessions the client cancelled, and the end of the connection. It sends `$/cancel_request` and v2 `state_update`s.
All of its state belongs to the one connection and goes when the connection ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from typing import Any

from service.core.errors import ClientNotInitialized

from .adapter import AgentConnection, SdkConnection
from .jsonrpc import CANCEL_REQUEST, RequestId, valid_id

log = logging.getLogger("service.acp")

# Every ACP connection key starts so: a completion this process created for a key it no longer holds is an ACP
# connection's (told undeliverable here), not another face's.
LINK_KEY_PREFIX = "acp-link-"


class ForegroundState(StrEnum):
    RUNNING = "running"
    IDLE = "idle"
    REQUIRES_ACTION = "requires_action"


StateListener = Callable[[str, ForegroundState], Awaitable[None] | None]

_ATTACH_EARLY = (
    "attach it with Connector.attach() in on_connect (before initialize), or pass client_capabilities to "
    "request_authorization"
)


class AcpLink:
    """One client connection as the connector sees it (create it with `AcpAuthorizer.attach`)."""

    def __init__(self, conn: AgentConnection, *, on_closed: Callable[[AcpLink], None] | None = None) -> None:
        self.key = LINK_KEY_PREFIX + secrets.token_urlsafe(12)
        self.initialize_params: dict[str, Any] | None = None
        self.negotiated_version: int | None = None
        self._on_closed = on_closed
        self._initialize_asked: tuple[Any, dict[str, Any]] | None = None  # (JSON-RPC id, params) until answered
        self._heard_from_client = False
        self._initialized = asyncio.Event()
        self._pending_creates: dict[str, RequestId] = {}  # elicitationId -> JSON-RPC id of our request
        self._cancelled_sessions: set[str] = set()  # session/cancel seen, no new prompt since
        # Futures to wake when the connection ends: a list (a slot each, where a set's table costs 30-100 bytes an
        # entry), with the forgotten ones dropped once they are as many as the rest.
        self._close_waiters: list[asyncio.Future[Any]] = []
        self._forgotten = 0
        self._sdk = SdkConnection.install(conn, self)
        self._connection = weakref.ref(conn)

    # -- what the client said at initialize ------------------------------------------------------------
    @property
    def raw_capabilities(self) -> Mapping[str, Any] | None:
        """`clientCapabilities` (ACP v1) or `capabilities` (v2) exactly as the client sent them."""
        params = self.initialize_params or {}
        for key in ("clientCapabilities", "capabilities"):
            value = params.get(key)
            if isinstance(value, Mapping):
                return value
        return None

    @property
    def v2(self) -> bool:
        return self.negotiated_version is not None and self.negotiated_version >= 2

    async def client_capabilities(self, fallback: Any, wait_seconds: float) -> Any:
        """The client's capabilities: as seen in `initialize`, else `fallback` when given, else wait for `initialize`.

        Waits at most `wait_seconds` for the client's `initialize` when nothing has arrived on the connection yet
        (attached in `on_connect`, and asked before the client's first message). Raises `ClientNotInitialized` when
        it does not come, and at once when it cannot come any more (other messages arrived first, or `wait_seconds`
        is 0: the connection was not attached before `initialize`). None when the connection ended meanwhile.
        """
        if self.initialize_params is not None:
            return self.raw_capabilities
        if fallback is not None:
            return fallback
        if self._heard_from_client or wait_seconds <= 0:
            raise ClientNotInitialized(f"the client's initialize was not seen on this connection: {_ATTACH_EARLY}")
        initialized = asyncio.ensure_future(self._initialized.wait())
        closed = asyncio.ensure_future(self._sdk.transport.wait_closed())
        try:
            await asyncio.wait({initialized, closed}, timeout=wait_seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            initialized.cancel()
            closed.cancel()
        if self.initialize_params is not None:
            return self.raw_capabilities
        if self.closed:
            return None
        raise ClientNotInitialized(f"the client sent no initialize within {wait_seconds:g} s: {_ATTACH_EARLY}")

    # -- the connection --------------------------------------------------------------------------------
    @property
    def conn(self) -> AgentConnection | None:
        return self._connection()

    @property
    def closed(self) -> bool:
        """Whether the connection has ended (the peer went away, a read or write failed, or it was closed)."""
        return self._sdk.closed

    async def wait_closed(self) -> None:
        await self._sdk.transport.wait_closed()

    def wake_on_close(self, waiter: asyncio.Future[Any]) -> None:
        """Resolve `waiter` with None when the connection ends (at once if it has), unless it is done by then.

        For the many waiters of one connection: each costs a list slot, not a task or a callback.
        """
        if self.closed:
            _wake(waiter)
        else:
            self._close_waiters.append(waiter)

    @property
    def close_waiters(self) -> int:
        """How many futures it keeps to wake when the connection ends (forgotten ones until they are dropped)."""
        return len(self._close_waiters)

    def forget_waiter(self, waiter: asyncio.Future[Any]) -> None:
        """`waiter` (done by now: resolved or cancelled) needs no waking any more."""
        self._forgotten += 1
        if self._forgotten * 2 > len(self._close_waiters):
            self._close_waiters = [w for w in self._close_waiters if w is not waiter and not w.done()]
            self._forgotten = 0

    def session_cancelled(self, session_id: str) -> bool:
        """Whether the client sent `session/cancel` for `session_id` since its last prompt there."""
        return session_id in self._cancelled_sessions

    # -- requests we make ------------------------------------------------------------------------------
    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send a request; the client's raw result (`RequestError` for an error, `ConnectionError` when gone)."""
        return await self._sdk.request(method, params)

    def pending_request_id(self, elicitation_id: str) -> RequestId | None:
        """The JSON-RPC id of our `elicitation/create` for `elicitation_id` while the client has not answered it."""
        return self._pending_creates.get(elicitation_id)

    async def withdraw(self, elicitation_id: str) -> bool:
        """Withdraw our unanswered `elicitation/create` with `$/cancel_request` (once). False if nothing was sent."""
        request_id = self._pending_creates.pop(elicitation_id, None)
        if request_id is None or self.closed:
            return False
        self._sdk.transport.abandon(request_id)
        return await self._notify(CANCEL_REQUEST, {"requestId": request_id})

    async def send_state(self, session_id: str, state: ForegroundState, stop_reason: str | None = None) -> bool:
        """Send an ACP v2 `state_update` (only on connections that negotiated v2)."""
        if not self.v2 or self.closed:
            return False
        update: dict[str, Any] = {"sessionUpdate": "state_update", "state": state.value}
        if stop_reason is not None:
            update["stopReason"] = stop_reason
        return await self._notify("session/update", {"sessionId": session_id, "update": update})

    async def _notify(self, method: str, params: dict[str, Any]) -> bool:
        try:
            await self._sdk.notify(method, params)
        except ConnectionError:
            return False
        return True

    # -- WireListener ----------------------------------------------------------------------------------
    def on_incoming(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params")
        if method is None:
            self._forget_create(message.get("id"))
            return
        if method == "initialize" and self.initialize_params is None and isinstance(params, dict):
            self._initialize_asked = (message.get("id"), params)  # counts once the agent answers it with a result
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        if isinstance(session_id, str):
            if method == "session/cancel":
                self._cancelled_sessions.add(session_id)
            elif method == "session/prompt":
                self._cancelled_sessions.discard(session_id)  # a new turn
        self._heard_from_client = True

    def on_outgoing(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params")
        if method == "elicitation/create" and isinstance(params, dict) and valid_id(message.get("id")):
            elicitation_id = params.get("elicitationId")
            if isinstance(elicitation_id, str):
                self._pending_creates[elicitation_id] = message["id"]
        elif method is None and self._initialize_asked is not None:
            asked_id, asked_params = self._initialize_asked
            if _same_id(message.get("id"), asked_id):
                self._initialize_asked = None
                self._initialized_by(asked_params, message.get("result"))

    def _initialized_by(self, params: dict[str, Any], result: Any) -> None:
        if not isinstance(result, dict):
            return  # the agent refused this initialize (an error): the client has not initialized
        self.initialize_params = params
        version = result.get("protocolVersion")
        if isinstance(version, int) and not isinstance(version, bool):
            self.negotiated_version = version
        self._initialized.set()

    def on_closed(self) -> None:
        self._pending_creates.clear()
        self._cancelled_sessions.clear()
        waiters, self._close_waiters, self._forgotten = self._close_waiters, [], 0
        for waiter in waiters:
            _wake(waiter)
        if self._on_closed is not None:
            with contextlib.suppress(Exception):
                self._on_closed(self)

    def _forget_create(self, request_id: Any) -> None:
        for elicitation_id, pending in list(self._pending_creates.items()):
            if _same_id(pending, request_id):
                del self._pending_creates[elicitation_id]


def _wake(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _same_id(one: Any, other: Any) -> bool:
    return valid_id(one) and valid_id(other) and type(one) is type(other) and one == other
