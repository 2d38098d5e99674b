"""The async engine: URL handling, SQLite pragmas, and the connection scope repository methods run in."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA foreign_keys=ON",
    "PRAGMA busy_timeout=5000",
)


def create_engine(url: str) -> AsyncEngine:
    """Create the async engine for `url` (sqlite+aiosqlite or postgresql+asyncpg).

    For SQLite every new connection gets WAL journaling, foreign keys and a 5 s busy timeout, and the parent
    directory of a file database is created.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_async_engine(parsed, pool_pre_ping=True)

    path = _sqlite_file(parsed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(parsed)
    event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    return engine


def _sqlite_file(url: URL) -> Path | None:
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        for pragma in SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def display_url(url: str | URL) -> str:
    """The URL as it may appear in messages and logs: the password removed."""
    parsed = make_url(url)
    # URL.set() treats None as "unchanged", so rebuild the URL without the password.
    without_password = URL.create(
        parsed.drivername,
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query=parsed.query,
    )
    return without_password.render_as_string(hide_password=False)


@asynccontextmanager
async def connection_scope(engine: AsyncEngine, conn: AsyncConnection | None) -> AsyncIterator[AsyncConnection]:
    """Join the caller's transaction when `conn` is given, else run in a new one that commits on success."""
    if conn is not None:
        yield conn
        return
    async with engine.begin() as own:
        yield own


def dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def load_json(text: str) -> Any:
    return json.loads(text)
