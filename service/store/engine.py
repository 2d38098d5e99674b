"""The async engine: URL handling, SQLite pragmas, and the connection scope repository methods run in."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from service.core.errors import DatabaseUnavailable

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
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unavailable(url, exc) from exc
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


def unavailable(url: str | URL, exc: BaseException) -> DatabaseUnavailable:
    """The error for a database that cannot be reached or opened, saying why and what to check."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    if isinstance(cause, OSError) and cause.strerror:
        reason = cause.strerror + (f": {cause.filename}" if cause.filename else "")
    else:
        reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    return DatabaseUnavailable(
        f"cannot open the database at {display_url(url)}: {reason} "
        "(check database.url / CONNECTOR_DATABASE__URL, and that the database server is running)"
    )


@asynccontextmanager
async def connected(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection; failing to open it raises DatabaseUnavailable (errors inside the block pass unchanged)."""
    conn = engine.connect()
    try:
        await conn.start()
    except (OSError, DBAPIError) as exc:
        raise unavailable(engine.url, exc) from exc
    try:
        yield conn
    finally:
        await conn.close()


async def probe(url: str) -> None:
    """Open and close one connection to `url`: raises DatabaseUnavailable with the reason if that fails."""
    engine = create_engine(url)
    try:
        async with connected(engine):
            pass
    finally:
        await engine.dispose()


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
