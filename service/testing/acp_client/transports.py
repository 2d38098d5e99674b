"""Message transports for the scripted client: an in-memory pair, newline-delimited JSON over byte streams, and the
wrapper through which the client sees (and sometimes consumes) every message first."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any, Protocol

__all__ = ["Transport", "memory_transport_pair"]


class Transport(Protocol):
    """A JSON-RPC message transport, as the SDK's connections take it: `receive()` returns None at the end."""

    async def send(self, message: dict[str, Any]) -> None: ...

    async def receive(self) -> dict[str, Any] | None: ...

    async def close(self) -> None: ...


class _MemoryEnd:
    def __init__(self, outbox: asyncio.Queue[dict[str, Any] | None], inbox: asyncio.Queue[dict[str, Any] | None]):
        self._outbox = outbox
        self._inbox = inbox
        self._shut = False

    async def send(self, message: dict[str, Any]) -> None:
        if self._shut:
            raise ConnectionError("Transport closed")
        self._outbox.put_nowait(copy.deepcopy(message))

    async def receive(self) -> dict[str, Any] | None:
        return await self._inbox.get()

    async def close(self) -> None:
        if not self._shut:
            self._shut = True
            self._outbox.put_nowait(None)


def memory_transport_pair() -> tuple[Transport, Transport]:
    """Two linked in-memory transports: what one end sends, the other receives; closing an end ends the other's."""
    one: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    other: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    return _MemoryEnd(one, other), _MemoryEnd(other, one)


class _Observer(Protocol):
    """The scripted client, as its transports see it."""

    def _on_outgoing(self, message: dict[str, Any]) -> dict[str, Any]: ...

    def _on_incoming(self, message: dict[str, Any]) -> bool: ...

    def _violation(self, rule: str, detail: str, request_id: Any = None) -> None: ...


class _ScriptedTransport:
    """A message transport that lets the scripted client see (and sometimes consume) everything first."""

    def __init__(self, inner: Transport, client: _Observer) -> None:
        self._inner = inner
        self._client = client

    async def send(self, message: dict[str, Any]) -> None:
        await self._inner.send(self._client._on_outgoing(message))

    async def receive(self) -> dict[str, Any] | None:
        while True:
            message = await self._inner.receive()
            if message is None:
                return None
            if not self._client._on_incoming(message):
                return message

    async def close(self) -> None:
        await self._inner.close()


class _StdioTransport:
    """Newline-delimited JSON over a subprocess's pipes; a non-JSON line on stdout is a violation."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: _Observer) -> None:
        self._reader = reader
        self._writer = writer
        self._client = client
        self._lock = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n"
        async with self._lock:
            self._writer.write(data.encode("utf-8"))
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        while True:
            try:
                line = await self._reader.readline()
            except (ConnectionError, ValueError):
                return None
            if not line:
                return None
            text = line.strip()
            if not text:
                continue
            try:
                message = json.loads(text)
            except ValueError:
                self._client._violation("stdout_not_json", "the agent wrote a line that is not JSON to stdout")
                continue
            if isinstance(message, dict):
                return message
            self._client._violation("stdout_not_json", "the agent wrote a JSON value that is not an object")

    async def close(self) -> None:
        return None
