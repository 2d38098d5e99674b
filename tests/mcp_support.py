"""The official MCP Python SDK's client against the example MCP server, with the wire recorded.

`RecordedWire` wraps any client transport (stdio, streamable HTTP) and keeps every JSON-RPC message that passes, in
both directions, as the JSON the SDK sent or parsed; `Asker` is the client's elicitation callback (it answers as told
and records what it was asked); `McpRun` is one connected client with both.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.shared.message import SessionMessage

from service.testing import MockOAuthProvider

from .api_support import make_key
from .sidecar_support import Sidecar, running_sidecar

COMPLETE = "notifications/elicitation/complete"


class RecordedWire:
    """A client `Transport` that records each message between the SDK's client and `inner`."""

    def __init__(self, inner: AbstractAsyncContextManager[Any]) -> None:
        self.inner = inner
        self.messages: list[tuple[str, dict[str, Any]]] = []  # ("in" | "out", the JSON-RPC message)
        self._task_group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self.inner.__aenter__()
        to_client: tuple[MemoryObjectSendStream[Any], MemoryObjectReceiveStream[Any]] = (
            anyio.create_memory_object_stream(100)
        )
        from_client: tuple[MemoryObjectSendStream[Any], MemoryObjectReceiveStream[Any]] = (
            anyio.create_memory_object_stream(100)
        )
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._pump, read, to_client[0], "in")
        self._task_group.start_soon(self._pump, from_client[1], write, "out")
        return to_client[1], from_client[0]

    async def _pump(self, source: Any, sink: Any, direction: str) -> None:
        async with sink:
            async for item in source:
                if isinstance(item, SessionMessage):
                    self.messages.append((direction, item.message.model_dump(by_alias=True, exclude_none=True)))
                await sink.send(item)

    async def __aexit__(self, *exc: Any) -> None:
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        await self._task_group.__aexit__(None, None, None)
        await self.inner.__aexit__(*exc)

    def received(self, method: str) -> list[dict[str, Any]]:
        return [m for d, m in self.messages if d == "in" and m.get("method") == method]

    def sent(self, method: str) -> list[dict[str, Any]]:
        return [m for d, m in self.messages if d == "out" and m.get("method") == method]

    def text(self) -> str:
        return json.dumps(self.messages)


@dataclass
class Asker:
    """The client's elicitation callback: answers `action` and records each request (its params as JSON)."""

    action: str = "accept"
    asked: list[dict[str, Any]] = field(default_factory=list)
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, ctx: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.model_dump(by_alias=True, exclude_none=True))
        self._event.set()
        return types.ElicitResult(action=self.action)  # type: ignore[arg-type]

    async def next_url(self, within: float = 120) -> str:
        """The URL of the first elicitation, once the client was asked."""
        await asyncio.wait_for(self._event.wait(), within)
        return str(self.asked[0]["url"])


class FormOnlySession(ClientSession):
    """A client with an elicitation handler for forms only: it advertises `"elicitation": {}` (MCP: form only)."""

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        built = super()._build_capabilities(version)
        return built.model_copy(update={"elicitation": types.ElicitationCapability()})


class FormOnlyClient(Client):
    async def _build_session(self, exit_stack: Any) -> ClientSession:
        session = await super()._build_session(exit_stack)
        session.__class__ = FormOnlySession
        return session


@dataclass
class McpRun:
    client: Client
    wire: RecordedWire
    asker: Asker

    def call(self, tool: str) -> asyncio.Task[types.CallToolResult]:
        return asyncio.create_task(self.client.call_tool(tool, {}))


@asynccontextmanager
async def connected(
    transport: AbstractAsyncContextManager[Any], asker: Asker, *, mode: str = "legacy", form_only: bool = False
) -> AsyncIterator[McpRun]:
    """The SDK's client over `transport` (recorded), with `asker` answering elicitations."""
    wire = RecordedWire(transport)
    kind = FormOnlyClient if form_only else Client
    async with kind(wire, elicitation_callback=asker, mode=mode, read_timeout_seconds=300) as client:  # type: ignore[arg-type]
        yield McpRun(client, wire, asker)


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


REPOS = [{"id": 1, "full_name": "octocat/hello-world", "private": False}]


@asynccontextmanager
async def shared_sidecar(tmp_path: Path) -> AsyncIterator[tuple[Sidecar, MockOAuthProvider]]:
    """A sidecar (its own process) over a mock provider with one repository, for a module of tests."""
    provider = MockOAuthProvider(repos=REPOS)
    async with running_sidecar(tmp_path, provider) as sidecar:
        yield sidecar, provider


async def fresh_tenant(shared: tuple[Sidecar, MockOAuthProvider], prefix: str) -> Sidecar:
    """The shared sidecar under a tenant of the calling test's own, its user without grants, no API calls seen."""
    running, provider = shared
    provider.api_calls.clear()
    for grant in await running.store.grants.find(running.local_user, "github"):
        await running.store.grants.delete(grant.id)
    running.api_key = await make_key(running.store, tenant=f"{prefix}-{uuid.uuid4().hex[:12]}")
    return running
