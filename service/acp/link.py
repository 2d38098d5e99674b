"""`AcpLink`: one client connection as the connector sees it.

It reads the raw `initialize` params off the wire (v1 `clientCapabilities`, v2 `capabilities`) and the negotiated
protocol version, remembers the JSON-RPC id of each of our pending `elicitation/create` requests (so a cancelled
one can be named in `$/cancel_request`), and sends v2 `state_update`s. SDK internals are in `adapter` only.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from typing import Any

from acp.connection import StreamDirection, StreamEvent

from .adapter import CANCEL_REQUEST, AgentConnection, SdkConnection

log = logging.getLogger("service.acp")


class ForegroundState(StrEnum):
    RUNNING = "running"
    IDLE = "idle"
    REQUIRES_ACTION = "requires_action"


StateListener = Callable[[str, ForegroundState], Awaitable[None] | None]


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
        self._sdk = SdkConnection.of(conn)
        if self._sdk is not None:
            self._sdk.install(self._observe)

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
        """Whether the peer has gone away."""
        return self._sdk is None or self._sdk.closed()

    # -- requests we make ------------------------------------------------------------------------------
    def pending_request_id(self, elicitation_id: str) -> Any:
        return self._pending_creates.get(elicitation_id)

    async def cancel_request(self, request_id: Any) -> bool:
        """Send `$/cancel_request` for one of our requests. False when the connection is gone."""
        if self._sdk is None or self.closed():
            return False
        try:
            await self._sdk.notify(CANCEL_REQUEST, {"requestId": request_id})
        except ConnectionError:
            return False
        return True

    async def send_state(self, session_id: str, state: ForegroundState, stop_reason: str | None = None) -> bool:
        """Send an ACP v2 `state_update` (only on connections that negotiated v2)."""
        if not self.v2 or self._sdk is None or self.closed():
            return False
        update: dict[str, Any] = {"sessionUpdate": "state_update", "state": state.value}
        if stop_reason is not None:
            update["stopReason"] = stop_reason
        try:
            await self._sdk.notify("session/update", {"sessionId": session_id, "update": update})
        except ConnectionError:
            return False
        return True

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
