"""`spawn_agent`: an ACP agent subprocess, driven by a `ScriptedClient` over its stdio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from acp.client.connection import ClientSideConnection
from acp.transports import spawn_stdio_transport

if TYPE_CHECKING:
    from .client import ScriptedClient

__all__ = ["STDIO_LIMIT", "SpawnedAgent", "spawn_agent"]

STDIO_LIMIT: Final = 50 * 1024 * 1024


@dataclass
class SpawnedAgent:
    """An agent subprocess driven by a `ScriptedClient` over stdio."""

    conn: ClientSideConnection
    process: asyncio.subprocess.Process
    _stderr: bytearray = field(default_factory=bytearray, repr=False)

    def stderr(self) -> str:
        """What the agent wrote to stderr so far."""
        return self._stderr.decode("utf-8", errors="replace")


@asynccontextmanager
async def spawn_agent(
    client: ScriptedClient,
    command: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    shutdown_timeout: float = 10.0,
    on_stderr: Callable[[str], None] | None = None,
) -> AsyncIterator[SpawnedAgent]:
    """Start an ACP agent subprocess (the SDK's `spawn_stdio_transport`) and connect `client` to its stdio.

    `env` is added to the SDK's trimmed default environment. Stderr is collected (`SpawnedAgent.stderr()`) and,
    with `on_stderr`, handed over line by line as it arrives (to show the agent's log while it runs).
    On exit the connection closes, stdin is closed and the process is given `shutdown_timeout` seconds to exit
    before it is terminated (a terminated agent has a negative `process.returncode`).
    """
    async with spawn_stdio_transport(
        command, *args, env=env, cwd=cwd, limit=STDIO_LIMIT, shutdown_timeout=shutdown_timeout
    ) as (reader, writer, proc):
        spawned_stderr = bytearray()

        async def drain_stderr() -> None:
            if proc.stderr is None:
                return
            pending = b""
            while chunk := await proc.stderr.read(65536):
                spawned_stderr.extend(chunk)
                if on_stderr is not None:
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        on_stderr(line.decode("utf-8", errors="replace"))
            if on_stderr is not None and pending:
                on_stderr(pending.decode("utf-8", errors="replace"))

        stderr_task = asyncio.create_task(drain_stderr())
        conn = client.connect_streams(reader, writer)
        try:
            yield SpawnedAgent(conn, proc, spawned_stderr)
        finally:
            await conn.close()
    # The SDK closed stdin and waited for the process (terminating it if needed): stderr is at its end.
    with suppress(TimeoutError):
        await asyncio.wait_for(stderr_task, 5)
