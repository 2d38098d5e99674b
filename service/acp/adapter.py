"""The one module that touches the `acp` SDK's internals (agent-client-protocol 0.12).

The SDK has no public hooks for what the connector needs, so this module reaches into its `Connection`:
- it observes every JSON-RPC message (public `add_observer`);
- it routes an incoming `$/cancel_request` notification to the connector instead of "method not found", and
  answers a request cancelled that way with -32800 (its router and request runner are wrapped);
- it tells whether the peer has gone away (private flags; there is no public signal).
Nothing outside this module names an SDK private attribute.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from acp.connection import Connection, StreamEvent
from acp.interfaces import Client

# What the agent holds for its client: `acp.AgentSideConnection`, typed by the SDK's protocol.
AgentConnection = Client

CANCEL_REQUEST = "$/cancel_request"
REQUEST_CANCELLED = -32800


def _id_key(request_id: Any) -> tuple[str, Any]:
    # JSON-RPC ids may be numbers or strings: 1 and "1" are different requests.
    return (type(request_id).__name__, request_id)


class SdkConnection:
    """The SDK `Connection` underneath an agent-side connection object, with the connector's hooks installed."""

    def __init__(self, inner: Connection) -> None:
        self._inner = inner
        self._serving: dict[tuple[str, Any], asyncio.Task[Any]] = {}  # the client's requests being served
        self._cancelled_by_peer: set[tuple[str, Any]] = set()

    @classmethod
    def of(cls, conn: AgentConnection) -> SdkConnection | None:
        inner = getattr(conn, "_conn", None)
        return cls(inner) if isinstance(inner, Connection) else None

    def closed(self) -> bool:
        inner = self._inner
        return bool(getattr(inner, "_disconnected", False) or getattr(inner, "_closed", False))

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._inner.send_notification(method, params)

    def install(self, observer: Callable[[StreamEvent], None]) -> None:
        """Observe every message, and serve `$/cancel_request` for the client's requests in progress."""
        inner = self._inner
        inner.add_observer(observer)
        route = inner._handler  # the SDK's router
        run_request = inner._run_request

        async def handler(method: str, params: Any, is_notification: bool) -> Any:
            if method == CANCEL_REQUEST and is_notification:
                self._on_peer_cancel(params)
                return None
            return await route(method, params, is_notification)

        async def serve_request(message: dict[str, Any]) -> None:
            key = _id_key(message.get("id"))
            task = asyncio.current_task()
            if task is not None:
                self._serving[key] = task
            try:
                await run_request(message)
            except asyncio.CancelledError:
                if key not in self._cancelled_by_peer:
                    raise
                # Cancelled at the client's request: the request still gets its answer.
                await inner._transport.send(
                    {
                        "jsonrpc": "2.0",
                        "id": message.get("id"),
                        "error": {"code": REQUEST_CANCELLED, "message": "Request cancelled"},
                    }
                )
            finally:
                self._serving.pop(key, None)
                self._cancelled_by_peer.discard(key)

        inner._handler = handler
        inner._run_request = serve_request  # type: ignore[method-assign]

    def _on_peer_cancel(self, params: Any) -> None:
        request_id = params.get("requestId") if isinstance(params, dict) else None
        task = self._serving.get(_id_key(request_id))
        if task is None or task.done():
            return
        self._cancelled_by_peer.add(_id_key(request_id))
        task.cancel()
