"""The one module that touches the `acp` SDK's internals (agent-client-protocol, the range in `SUPPORTED`).

The SDK (0.12) has no public hook for what the connector needs on an existing `AgentSideConnection`: seeing every
message, validating what the peer sends, serving `$/cancel_request`, and knowing when the peer has gone. So at attach
time this module, after checking the SDK's version and the attributes it relies on:

- puts a `GuardedTransport` (`wire.py`, the connector's own stream) between the SDK's `Connection` and the transport
  the SDK built (`Connection._transport`): every message in both directions passes through it. On stdio (the SDK's
  `NdjsonTransport`) it reads the lines from the transport's byte stream itself and writes them on the transport's
  stream writer (the one the SDK's `MessageSender` holds);
- wraps the SDK's dispatch function (`Connection._handler`) so that the task serving each of the peer's requests is
  known to the transport, which is what lets `$/cancel_request` cancel it.

Both are read by the SDK on every message, so replacing them from `on_connect` (before the first message) sees the
whole conversation. Nothing outside this module names an SDK private attribute.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from acp.connection import Connection
from acp.interfaces import Client

from service.core.errors import AcpSdkUnsupported
from service.faces.sdk import in_range, installed_version

from .wire import GuardedTransport, NdjsonLines, NdjsonWriter, Transport, WireListener, serving

# What the agent holds for its client: `acp.AgentSideConnection`, typed by the SDK's protocol.
AgentConnection = Client

SDK_DISTRIBUTION = "agent-client-protocol"
SUPPORTED = ((0, 12, 1), (0, 13, 0))  # [lowest, first unsupported): what this module was written and tested for
SUPPORTED_TEXT = ">=0.12.1,<0.13"


def sdk_version() -> str:
    return installed_version(SDK_DISTRIBUTION)


def check_sdk_version(version: str | None = None) -> None:
    """Raise `AcpSdkUnsupported` unless the installed SDK is in the range this adapter was written for."""
    version = sdk_version() if version is None else version
    if not in_range(version, SUPPORTED):
        raise AcpSdkUnsupported(
            f"{SDK_DISTRIBUTION} {version} is not supported: the connector's ACP adapter was written for "
            f"{SDK_DISTRIBUTION} {SUPPORTED_TEXT} (install a version in that range)"
        )


def _ndjson_lines(transport: Any) -> NdjsonLines | None:
    """On the SDK's stdio transport, the byte stream it reads from: the connector reads the lines itself (the SDK's
    reader takes a `null` line for the end of the stream, and drops bad JSON without an answer)."""
    reader = getattr(transport, "_reader", None)
    if type(transport).__name__ != "NdjsonTransport" or not isinstance(reader, asyncio.StreamReader):
        return None
    timeout = getattr(transport, "_receive_timeout", None)
    return NdjsonLines(reader, timeout if isinstance(timeout, int | float) else None)


def _ndjson_writer(transport: Any) -> NdjsonWriter | None:
    """On the SDK's stdio transport, the stream its sender writes to: the connector writes each line there at once
    (the SDK's sender queues it for a task of its own to write: a task switch and a future per message)."""
    writer = getattr(getattr(transport, "_sender", None), "_writer", None)
    if type(transport).__name__ != "NdjsonTransport" or not isinstance(writer, asyncio.StreamWriter):
        return None
    return NdjsonWriter(writer)


class SdkConnection:
    """The SDK `Connection` under an agent-side connection, with the connector's transport in place."""

    def __init__(self, inner: Connection, transport: GuardedTransport) -> None:
        self._inner = inner
        self.transport = transport

    @classmethod
    def install(cls, conn: AgentConnection, listener: WireListener) -> SdkConnection:
        """Put the connector between `conn` and its wire. Raises `AcpSdkUnsupported` when the SDK is not as expected."""
        check_sdk_version()
        inner = getattr(conn, "_conn", None)
        if not isinstance(inner, Connection):
            raise AcpSdkUnsupported(
                f"{type(conn).__name__} is not an agent-side connection of {SDK_DISTRIBUTION} {sdk_version()} "
                "(expected acp.AgentSideConnection, with its Connection in `_conn`)"
            )
        current = getattr(inner, "_transport", None)
        route = getattr(inner, "_handler", None)
        is_transport = all(callable(getattr(current, m, None)) for m in ("send", "receive", "close"))
        missing = [
            name
            for name, ok in (("Connection._transport", is_transport), ("Connection._handler", callable(route)))
            if not ok
        ]
        if missing:
            raise AcpSdkUnsupported(
                f"{SDK_DISTRIBUTION} {sdk_version()} does not have what the connector's ACP adapter needs "
                f"({', '.join(missing)}); supported: {SUPPORTED_TEXT}"
            )
        if isinstance(current, GuardedTransport):
            raise AcpSdkUnsupported("this connection is already attached")
        transport = GuardedTransport(
            cast(Transport, current), listener, _ndjson_lines(current), _ndjson_writer(current)
        )
        assert route is not None

        async def dispatch(method: str, params: Any, is_notification: bool) -> Any:
            request = serving()
            if is_notification or request is None or request.method != method:
                return await route(method, params, is_notification)
            return await transport.serve(request, route(method, params, is_notification))

        inner._transport = transport
        inner._handler = dispatch
        if getattr(inner, "_closed", False) or getattr(inner, "_disconnected", False):
            transport.end("the connection had ended before it was attached")
        return cls(inner, transport)

    @staticmethod
    def installed(conn: AgentConnection) -> WireListener | None:
        """The listener `install` put on `conn`, if any."""
        transport = getattr(getattr(conn, "_conn", None), "_transport", None)
        return transport.listener if isinstance(transport, GuardedTransport) else None

    @property
    def closed(self) -> bool:
        return self.transport.closed

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send a request and return the peer's raw result (`RequestError` for an error, `ConnectionError` if gone)."""
        return await self._inner.send_request(method, params)

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._inner.send_notification(method, params)
