"""The TypeScript face for the conformance suite: the example agent (`examples/ts_agent`, on `@acp-connector/client`)
in a Node process, driven over stdio by a `RawClient` (the same client the Python faces are driven by)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

from service import Identity

from .acp_peers import RawClient
from .ts_support import EXAMPLE, built_example


class StdioTransport:
    """Newline-delimited JSON-RPC over a subprocess's stdin and stdout (`receive()` is None at the end)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = process.stdout

    async def send(self, message: dict[str, Any]) -> None:
        if self._stdin.is_closing():
            raise ConnectionError("the agent's stdin is closed")
        self._stdin.write((json.dumps(message) + "\n").encode())
        await self._stdin.drain()

    async def receive(self) -> dict[str, Any] | None:
        while line := await self._stdout.readline():
            if line.strip():
                message = json.loads(line)
                assert isinstance(message, dict), line
                return message
        return None

    async def close(self) -> None:
        if not self._stdin.is_closing():
            self._stdin.close()


@dataclass
class TsAgentProcess:
    """The example agent's process (its stderr is kept for failure messages)."""

    process: asyncio.subprocess.Process
    stderr: bytearray

    def log(self) -> str:
        return self.stderr.decode(errors="replace")


@asynccontextmanager
async def ts_raw_peer(
    sidecar_url: str, api_key: str, user: Identity, client: RawClient, initialize: dict[str, Any]
) -> AsyncIterator[TsAgentProcess]:
    """The example agent for `user` on the sidecar at `sidecar_url`, `client` connected and initialized; on exit
    the client closes the connection and the agent is given 10 s to exit on its own."""
    script = built_example()
    env = {
        "SIDECAR_URL": sidecar_url,
        "SIDECAR_API_KEY": api_key,
        "AGENT_USER_ISSUER": user.issuer,
        "AGENT_USER_SUBJECT": user.subject,
        "PROVIDER": "github",
        "PATH": os.environ.get("PATH", ""),
    }
    process = await asyncio.create_subprocess_exec(
        "node",
        str(script),
        cwd=EXAMPLE,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stderr = bytearray()

    async def drain() -> None:
        assert process.stderr is not None
        while chunk := await process.stderr.read(65536):
            stderr.extend(chunk)

    draining = asyncio.create_task(drain())
    agent = TsAgentProcess(process, stderr)
    try:
        await client.start(StdioTransport(process))
        await asyncio.wait_for(client.initialize(initialize), 30)
        yield agent
    finally:
        await client.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
        with suppress(TimeoutError):
            await asyncio.wait_for(draining, 5)
