"""Running the ASGI app under uvicorn, whose access log is the connector's access log.

Query strings carry authorization codes and state: a filter on uvicorn's access logger strips them from every
line before any handler sees it. `service.logs` renders the line (text or JSON, with the request id).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

from ..core.errors import PortUnavailable
from .draining import Draining


class _StripQuery(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


def _access_log_without_queries() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _StripQuery) for f in access.filters):
        access.addFilter(_StripQuery())


DEFAULT_GRACE_SECONDS = 5


class Server(uvicorn.Server):
    """uvicorn's server, stopping at once when told to (`stop()`) and, with no connection open, without the
    grace period it would give them: uvicorn polls for `should_exit` every 0.1 s and then always waits 0.1 s.

    When it starts to stop it sets the app's `Draining` (`app.state.draining`, when the app has one), so open
    event streams end by themselves; what still runs after `timeout_graceful_shutdown` seconds is cancelled."""

    def __init__(self, config: uvicorn.Config, draining: Draining | None = None) -> None:
        super().__init__(config)
        self._stop = asyncio.Event()
        self.draining = draining

    def stop(self) -> None:
        self.should_exit = True
        self._stop.set()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.draining is not None:
            self.draining.start()
        if self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets)
            return
        logging.getLogger("uvicorn.error").info("Shutting down")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for server in self.servers:
            await server.wait_closed()


def make_server(app: Any, host: str, port: int, *, grace_seconds: int = DEFAULT_GRACE_SECONDS) -> Server:
    """A server for `app`: what is still running `grace_seconds` after it starts to stop is cancelled."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=True,
        # h11, also where httptools is installed (uvicorn would pick it): the HTTP parser is a safety boundary, and
        # the suite holds its answers to malformed requests (tests/test_api_bad_input.py) to h11's.
        http="h11",
        log_config=None,  # keep the process's logging setup
        proxy_headers=False,
        server_header=False,
        lifespan="off",
        timeout_graceful_shutdown=grace_seconds,
    )
    _access_log_without_queries()
    state = getattr(app, "state", None)
    draining = getattr(state, "draining", None)
    return Server(config, draining if isinstance(draining, Draining) else None)


async def serve(app: Any, sock: socket.socket, *, grace_seconds: int = DEFAULT_GRACE_SECONDS) -> None:
    """Serve `app` on the bound socket `sock` until the server stops."""
    host, port = sock.getsockname()[:2]
    await make_server(app, host, port, grace_seconds=grace_seconds).serve(sockets=[sock])


def bind(host: str, port: int) -> socket.socket:
    """`listening_socket`, with a failure to bind as PortUnavailable saying which address and why."""
    try:
        return listening_socket(host, port)
    except OSError as exc:
        raise PortUnavailable(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


LISTEN_BACKLOG = 2048  # uvicorn's default
PORT_ZERO_ATTEMPTS = 5


def listening_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to `host:port` (0: any free port), for `serving` or uvicorn's `sockets=`.

    Created with protocol IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections accepted from such a
    socket. Without it every keep-alive response waits for Nagle's algorithm to meet the client's delayed ACK
    (about 40 ms a request), which punishes exactly the clients that reuse connections.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # With SO_REUSEADDR, Linux may give port 0 a port that a connected socket uses, and only listen() finds the
    # clash (EADDRINUSE): then another port is tried, here rather than as a failed server start.
    for _ in range(PORT_ZERO_ATTEMPTS - 1 if port == 0 else 0):
        try:
            return _listening(family, host, port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    return _listening(family, host, port)


def _listening(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)  # the server's own listen() sets the backlog again
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class Running:
    """A server started by `serving`."""

    server: Server
    task: asyncio.Task[None]

    async def stopped(self) -> None:
        """Wait until the server stops by itself (a signal, or `server.should_exit`)."""
        await asyncio.shield(self.task)


@asynccontextmanager
async def serving(app: Any, sock: socket.socket) -> AsyncIterator[Running]:
    """Serve `app` on the bound socket `sock` while the block runs (started when the block begins)."""
    host, port = sock.getsockname()[:2]
    server = make_server(app, host, port)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # uvicorn offers a flag, not an event
        if task.done():
            task.result()
            raise RuntimeError(f"the server on {host}:{port} stopped while starting")
        await asyncio.sleep(0.01)
    try:
        yield Running(server, task)
    finally:
        server.stop()
        await task
