"""PostgreSQL LISTEN/NOTIFY: a process's one listening connection, and sending a notification.

The listening connection is its own (not from the pool, so the pool keeps its size) and carries the application
name `acp-connector listen <name>`, so an operator can find it in `pg_stat_activity`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from .engine import begun

APPLICATION_NAME = "acp-connector listen"
CONNECT_TIMEOUT_SECONDS = 10.0
PING_TIMEOUT_SECONDS = 5.0


class PgListener:
    """One open LISTEN connection on one channel. `on_payload` gets each notification's payload;
    `on_lost` is called once if the connection ends (the server terminated it, the network went)."""

    def __init__(self, conn: Any, channel: str) -> None:
        self._connection = conn
        self._channel = channel
        self._busy = asyncio.Lock()  # one statement at a time on one connection

    @classmethod
    async def open(
        cls,
        url: URL,
        channel: str,
        *,
        name: str,
        on_payload: Callable[[str], None],
        on_lost: Callable[[], None],
    ) -> PgListener:
        dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(
            dsn, timeout=CONNECT_TIMEOUT_SECONDS, server_settings={"application_name": f"{APPLICATION_NAME} {name}"}
        )
        try:
            conn.add_termination_listener(lambda _conn: on_lost())
            await conn.add_listener(channel, lambda _conn, _pid, _channel, payload: on_payload(payload))
        except BaseException:
            conn.terminate()
            raise
        return cls(conn, channel)

    @property
    def closed(self) -> bool:
        return bool(self._connection.is_closed())

    async def ping(self) -> None:
        """Raise if the connection no longer answers (a half-open connection does not end by itself)."""
        async with self._busy:
            await asyncio.wait_for(self._connection.execute("SELECT 1"), PING_TIMEOUT_SECONDS)

    async def notify(self, *payloads: str) -> None:
        """Send each payload on the channel, in order, through this connection: one round trip, no pool, no
        transaction (the statement's own: the notifications are delivered together when it ends)."""
        async with self._busy:
            if len(payloads) == 1:
                sent = self._connection.execute("SELECT pg_notify($1, $2)", self._channel, payloads[0])
            else:  # a function scan yields the array's elements in order
                sent = self._connection.execute(
                    "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p", self._channel, list(payloads)
                )
            await asyncio.wait_for(sent, PING_TIMEOUT_SECONDS)

    async def close(self) -> None:
        if self._connection.is_closed():
            return
        try:
            await asyncio.wait_for(self._connection.close(), PING_TIMEOUT_SECONDS)
        except Exception:
            self._connection.terminate()


async def notify(engine: AsyncEngine, channel: str, payload: str) -> None:
    """Send `payload` to every connection listening on `channel` through a pooled connection (when this process
    has no listening connection to send it through)."""
    async with begun(engine) as conn:
        await conn.execute(select(func.pg_notify(channel, payload)))
