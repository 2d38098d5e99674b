"""Everything that speaks ACP: capabilities, elicitation/create and /complete, `$/cancel_request`, state updates.

This is the only module that imports `acp`. It works on top of the official SDK's connection objects and
fills the SDK's gaps (0.12) here rather than forking it:
- the SDK neither sends nor routes `$/cancel_request`: `AcpLink` records the JSON-RPC id of each outgoing
  `elicitation/create` from the connection's message stream, sends the notification itself, and answers an
  incoming one by cancelling the request it names (replying -32800) instead of logging "method not found";
- it has no model for ACP v2's `capabilities` field or `state_update` session updates: the raw `initialize`
  params are read from the message stream and state updates are sent as raw `session/update` notifications.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from acp.connection import Connection, StreamDirection, StreamEvent
from acp.exceptions import RequestError
from acp.interfaces import Client
from acp.schema import (
    AcceptElicitationResponse,
    CancelElicitationResponse,
    ClientCapabilities,
    DeclineElicitationResponse,
    ElicitationUrlRequestMode,
    ElicitationUrlSessionMode,
)
from pydantic import ValidationError

from .scopes import ElicitationScope, SessionScope

log = logging.getLogger("service.acp")

# What the agent holds for its client: `acp.AgentSideConnection`, typed by the SDK's protocol.
AgentConnection = Client

CANCEL_REQUEST = "$/cancel_request"
REQUEST_CANCELLED = -32800


def url_mode_advertised(capabilities: ClientCapabilities | Mapping[str, Any] | None) -> bool:
    """True only when the client advertised URL-mode elicitation with an explicit, non-null `url` object.

    Accepts the SDK's `ClientCapabilities` model or the raw JSON object (`clientCapabilities` in ACP v1,
    `capabilities` in v2). An omitted or null `elicitation`, `{}`, and `{"url": null}` advertise nothing.
    """
    if capabilities is None:
        return False
    if isinstance(capabilities, ClientCapabilities):
        elicitation = capabilities.elicitation
        return elicitation is not None and elicitation.url is not None
    raw = capabilities.get("elicitation")
    if not isinstance(raw, Mapping):
        return False
    return isinstance(raw.get("url"), Mapping)


class AnswerKind(StrEnum):
    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"
    ERROR = "error"  # the client answered with a JSON-RPC error, or an answer we cannot parse
    DISCONNECTED = "disconnected"


@dataclass(frozen=True, slots=True)
class ElicitationAnswer:
    kind: AnswerKind
    error_code: int | None = None
    error_message: str | None = None


class ForegroundState(StrEnum):
    RUNNING = "running"
    IDLE = "idle"
    REQUIRES_ACTION = "requires_action"


StateListener = Callable[[str, ForegroundState], Awaitable[None] | None]


def _sdk_connection(conn: AgentConnection) -> Connection | None:
    inner = getattr(conn, "_conn", None)
    return inner if isinstance(inner, Connection) else None


class AcpLink:
    """One client connection as the connector sees it.

    Holds the raw `initialize` params, the negotiated protocol version, and the JSON-RPC ids of our
    pending `elicitation/create` requests; serves incoming `$/cancel_request`.
    """

    def __init__(self, conn: AgentConnection) -> None:
        self.conn = conn
        self.key = secrets.token_urlsafe(12)
        self.initialize_params: dict[str, Any] | None = None
        self.negotiated_version: int | None = None
        self._initialize_id: Any = None
        self._pending_creates: dict[str, Any] = {}  # elicitationId -> JSON-RPC id of our request
        self._serving: dict[Any, asyncio.Task[Any]] = {}  # JSON-RPC id -> task serving the client's request
        self._cancelled_by_peer: set[Any] = set()
        self._inner = _sdk_connection(conn)
        if self._inner is not None:
            self._instrument(self._inner)

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

    def closed(self) -> bool:
        """Whether the peer has gone away (the SDK keeps this in private flags; there is no public signal)."""
        inner = self._inner
        return bool(getattr(inner, "_disconnected", False) or getattr(inner, "_closed", False))

    # -- requests we make ------------------------------------------------------------------------------
    def pending_request_id(self, elicitation_id: str) -> Any:
        return self._pending_creates.get(elicitation_id)

    async def cancel_request(self, request_id: Any) -> bool:
        """Send `$/cancel_request` for one of our requests. False when the connection is gone."""
        if self._inner is None or self.closed():
            return False
        try:
            await self._inner.send_notification(CANCEL_REQUEST, {"requestId": request_id})
        except ConnectionError:
            return False
        return True

    async def send_state(self, session_id: str, state: ForegroundState, stop_reason: str | None = None) -> bool:
        """Send an ACP v2 `state_update` (only on connections that negotiated v2)."""
        if not self.v2 or self._inner is None or self.closed():
            return False
        update: dict[str, Any] = {"sessionUpdate": "state_update", "state": state.value}
        if stop_reason is not None:
            update["stopReason"] = stop_reason
        try:
            await self._inner.send_notification("session/update", {"sessionId": session_id, "update": update})
        except ConnectionError:
            return False
        return True

    # -- SDK instrumentation ---------------------------------------------------------------------------
    def _instrument(self, inner: Connection) -> None:
        inner.add_observer(self._observe)
        route = inner._handler  # the SDK's router
        run_request = inner._run_request

        async def handler(method: str, params: Any, is_notification: bool) -> Any:
            if method == CANCEL_REQUEST and is_notification:
                self._on_peer_cancel(params)
                return None
            return await route(method, params, is_notification)

        async def serve_request(message: dict[str, Any]) -> None:
            request_id = message.get("id")
            task = asyncio.current_task()
            if task is not None:
                self._serving[_id_key(request_id)] = task
            try:
                await run_request(message)
            except asyncio.CancelledError:
                if _id_key(request_id) not in self._cancelled_by_peer:
                    raise
                # Cancelled at the client's request: the request still gets its answer.
                await inner._transport.send(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "error": {"code": REQUEST_CANCELLED, "message": "Request cancelled"},
                    }
                )
            finally:
                self._serving.pop(_id_key(request_id), None)
                self._cancelled_by_peer.discard(_id_key(request_id))

        inner._handler = handler
        inner._run_request = serve_request  # type: ignore[method-assign]

    def _on_peer_cancel(self, params: Any) -> None:
        request_id = params.get("requestId") if isinstance(params, Mapping) else None
        task = self._serving.get(_id_key(request_id))
        if task is None or task.done():
            log.debug("$/cancel_request for a request not in progress")
            return
        self._cancelled_by_peer.add(_id_key(request_id))
        task.cancel()

    def _observe(self, event: StreamEvent) -> None:
        message = event.message
        method = message.get("method")
        if event.direction is StreamDirection.INCOMING:
            if method == "initialize" and isinstance(message.get("params"), dict):
                self.initialize_params = message["params"]
                self._initialize_id = message.get("id")
            elif method is None and "id" in message:
                self._forget_create(message["id"])
            return
        if method == "elicitation/create" and isinstance(message.get("params"), dict):
            elicitation_id = message["params"].get("elicitationId")
            if isinstance(elicitation_id, str):
                self._pending_creates[elicitation_id] = message.get("id")
        elif method is None and self._initialize_id is not None and message.get("id") == self._initialize_id:
            result = message.get("result")
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), int):
                self.negotiated_version = result["protocolVersion"]

    def _forget_create(self, request_id: Any) -> None:
        for elicitation_id, pending in list(self._pending_creates.items()):
            if pending == request_id:
                del self._pending_creates[elicitation_id]


def _id_key(request_id: Any) -> tuple[str, Any]:
    # JSON-RPC ids may be numbers or strings: 1 and "1" are different requests.
    return (type(request_id).__name__, request_id)


async def send_url_elicitation(
    conn: AgentConnection, *, elicitation_id: str, url: str, message: str, scope: ElicitationScope
) -> ElicitationAnswer:
    """Send `elicitation/create` in URL mode and translate the client's answer."""
    mode: ElicitationUrlSessionMode | ElicitationUrlRequestMode
    if isinstance(scope, SessionScope):
        mode = ElicitationUrlSessionMode(
            session_id=scope.session_id,
            tool_call_id=scope.tool_call_id,
            elicitation_id=elicitation_id,
            url=url,
        )
    else:
        mode = ElicitationUrlRequestMode(request_id=scope.request_id, elicitation_id=elicitation_id, url=url)
    try:
        response = await conn.create_elicitation(message, mode)
    except RequestError as exc:
        log.info("elicitation/create answered with error %s", exc.code, extra={"elicitation_id": elicitation_id})
        return ElicitationAnswer(AnswerKind.ERROR, error_code=exc.code, error_message=str(exc))
    except ConnectionError:
        return ElicitationAnswer(AnswerKind.DISCONNECTED)
    except ValidationError:
        return ElicitationAnswer(
            AnswerKind.ERROR, error_code=-32602, error_message="client sent an invalid elicitation response"
        )
    if isinstance(response, AcceptElicitationResponse):
        return ElicitationAnswer(AnswerKind.ACCEPT)
    if isinstance(response, DeclineElicitationResponse):
        return ElicitationAnswer(AnswerKind.DECLINE)
    if isinstance(response, CancelElicitationResponse):
        return ElicitationAnswer(AnswerKind.CANCEL)
    return ElicitationAnswer(AnswerKind.ERROR, error_message="unrecognised elicitation response")


async def send_completion(link: AcpLink, elicitation_id: str) -> bool:
    """Send `elicitation/complete`; False (and nothing sent) when the connection is gone."""
    if link.closed():
        return False
    try:
        await link.conn.complete_elicitation(elicitation_id=elicitation_id)
    except ConnectionError:
        return False
    return True
