"""The engines: URL handling, SQLite pragmas, and the read and write scopes repository methods run in.

Bound parameters are never part of an error message (`hide_parameters`): they may hold ciphertexts or hashes.

Reads and writes go different ways (`Database`):
- **reads** run outside any transaction, one statement each (SQLite: autocommit connections; PostgreSQL: the pool in
  AUTOCOMMIT), so a lookup costs one round trip and never holds a lock;
- **writes** run in a transaction. On SQLite every write transaction goes through *one* connection per process and
  starts with `BEGIN IMMEDIATE`: writers queue for that connection (bounded by `pool_timeout`) instead of meeting
  "database is locked", and the write lock is taken up front, where `busy_timeout` can wait for another process, never
  half way through. On PostgreSQL writes share the pool with reads.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as SqlalchemyTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool, QueuePool

from service.core.errors import DatabaseUnavailable

from .sqlite_driver import one_trip_dbapi

SQLITE_BUSY_TIMEOUT_MS = 5000
SQLITE_CACHE_KIB = 256  # page cache per connection
SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA foreign_keys=ON",
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    # WAL keeps the database consistent on a crash with NORMAL; a power loss may drop the last commits.
    "PRAGMA synchronous=NORMAL",
    # Each connection's page cache (SQLite's default is 2 MB) stays full as the file grows: with the writer and a
    # reader per concurrent request that was most of what a long-running process gained per flow. The pages come
    # back from the OS's file cache, which holds the file once for all connections, at a microsecond or so each.
    f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}",
    # A deleted or rewritten record's bytes are zeroed, not left in the page's or the file's free space: a grant
    # re-encrypted by `keys rotate` (or deleted, or carried through a step's note) leaves no ciphertext under the
    # old key behind for a retired key to open in a copy of the file.
    "PRAGMA secure_delete=ON",
)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """How many connections, and how long a request waits for one before it fails (bounded, never forever)."""

    size: int = 10  # PostgreSQL: pooled connections (reads and writes); SQLite: reading connections
    overflow: int = 10  # connections opened beyond `size` under load, closed again when returned
    timeout: float = 30.0  # seconds to wait for a free connection (SQLite: for the one writer)


def create_engine(url: str, pool: PoolSettings | None = None) -> AsyncEngine:
    """The write engine for `url` (sqlite+aiosqlite or postgresql+asyncpg), as migrations and writes use it.

    For SQLite: every connection gets WAL journaling, foreign keys and a busy timeout; the pool holds one connection
    and each transaction begins with `BEGIN IMMEDIATE`; the parent directory of a file database is created.
    """
    pool = pool or PoolSettings()
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_async_engine(
            parsed,
            pool_size=pool.size,
            max_overflow=pool.overflow,
            pool_timeout=pool.timeout,
            pool_pre_ping=True,
            hide_parameters=True,
        )
    path = _sqlite_file(parsed)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unavailable(url, exc) from exc
        engine = create_async_engine(
            parsed,
            pool_size=1,
            max_overflow=0,
            pool_timeout=pool.timeout,
            hide_parameters=True,
            **_one_trip(),
        )
    else:
        engine = create_async_engine(parsed, hide_parameters=True, **_one_trip())  # in memory: one connection
    event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    event.listen(engine.sync_engine, "begin", _sqlite_begin_immediate)
    return engine


def create_read_engine(url: str, writer: AsyncEngine, pool: PoolSettings | None = None) -> AsyncEngine:
    """The engine reads use: no transaction around a read. Shares the writer's pool where that is right."""
    pool = pool or PoolSettings()
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return writer.execution_options(isolation_level="AUTOCOMMIT")
    if _sqlite_file(parsed) is None:
        return writer  # an in-memory database exists only on the writer's connection
    # Autocommit: a read is its statement alone, with no rollback when the connection goes back to the pool.
    reader = create_async_engine(
        parsed,
        pool_size=pool.size,
        max_overflow=pool.overflow,
        pool_timeout=pool.timeout,
        isolation_level="AUTOCOMMIT",
        pool_reset_on_return=None,
        hide_parameters=True,
        **_one_trip(),
    )
    event.listen(reader.sync_engine, "connect", _sqlite_on_connect)
    return reader


class Database:
    """The two ways into the database: `read()` outside transactions, `write()` in one.

    Both join the caller's connection when one is given (`conn=` of a repository method), so reads inside a
    `Store.transaction()` see its writes.
    """

    def __init__(self, writer: AsyncEngine, reader: AsyncEngine) -> None:
        self.writer = writer
        self.reader = reader
        self._unpooled: AsyncEngine | None = None

    @classmethod
    def from_url(cls, url: str, pool: PoolSettings | None = None) -> Database:
        writer = create_engine(url, pool)
        return cls(writer, create_read_engine(url, writer, pool))

    @property
    def url(self) -> URL:
        return self.writer.url

    @property
    def dialect(self) -> str:
        return self.writer.dialect.name

    @asynccontextmanager
    async def read(self, conn: AsyncConnection | None = None) -> AsyncIterator[AsyncConnection]:
        if conn is not None:
            yield conn
            return
        async with pooled(self.reader) as own:
            yield own

    @asynccontextmanager
    async def write(self, conn: AsyncConnection | None = None) -> AsyncIterator[AsyncConnection]:
        if conn is not None:
            yield conn
            return
        async with begun(self.writer) as own:
            yield own

    @asynccontextmanager
    async def write_alone(self, conn: AsyncConnection | None = None) -> AsyncIterator[AsyncConnection]:
        """For write statements that are each their own transaction (or join the caller's `conn`): what the block
        does after a statement cannot undo it. PostgreSQL: in AUTOCOMMIT (the statement is atomic; no BEGIN and
        COMMIT round trips around it). SQLite: on the writer's connection, each statement with its `BEGIN IMMEDIATE`
        and its COMMIT in one trip to the connection's thread (`sqlite_driver`: `commit_each`), not two."""
        if conn is not None:
            yield conn
            return
        if self.dialect == "sqlite":
            async with begun(self.writer) as own:
                commit_each(own)
                yield own
            return
        async with pooled(self.reader) as own:
            yield own

    @asynccontextmanager
    async def write_unpooled(self) -> AsyncIterator[AsyncConnection]:
        """For one write statement that must get through while requests hold every pooled connection (the
        replica's heartbeat: a live replica starved of the pool for `dead_after_seconds` would be taken for gone,
        and its completions settled undeliverable). PostgreSQL: a connection of its own, opened for the statement
        and closed after it, in AUTOCOMMIT. SQLite: `write_alone` (one process's writer)."""
        if self.dialect == "sqlite":
            async with self.write_alone() as own:
                yield own
            return
        if self._unpooled is None:
            self._unpooled = create_async_engine(
                self.writer.url, poolclass=NullPool, isolation_level="AUTOCOMMIT", hide_parameters=True
            )
        async with self._unpooled.connect() as own:
            yield own

    async def truncate_write_ahead_log(self) -> bool | None:
        """SQLite: checkpoint the write-ahead log into the database and truncate it to nothing, so no page image
        written before now stays in the `-wal` file (zeroed records included). True when done, False when another
        connection held it past the busy timeout; None on PostgreSQL, which has no such file of its own."""
        if self.dialect != "sqlite" or _sqlite_file(self.writer.url) is None:
            return None
        async with pooled(self.reader) as conn:
            busy = (await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")).one()[0]  # (busy, frames, done)
        return not busy

    async def dispose(self) -> None:
        if self._unpooled is not None:
            await self._unpooled.dispose()
        if self.reader is not self.writer:
            await self.reader.dispose()
        await self.writer.dispose()


@asynccontextmanager
async def pooled(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """`engine.connect()`, returned to the pool in the caller's task when the block ends normally.

    SQLAlchemy's `AsyncConnection` closes in a task of its own, shielded from the caller's cancellation, so that a
    cancelled caller cannot leave its connection half returned to the pool: a task, a shield and more turns of the
    loop for every connection used, ~30-45 µs of CPU each (about a dozen a connect flow). After a block that ended
    normally nothing is half done: the transaction was committed or the reads ran in autocommit, so the pool's
    reset finds no transaction to roll back (the SQLite adapter asks SQLite, `sqlite_driver`; asyncpg's adapter has
    none open) and, while the pool has room for it, the connection goes back without being closed. Such a close
    awaits nothing, so no cancellation can reach it half way (tests/test_store_engine.py holds it to that). A block
    that raised, a cancellation included, or a connection the pool will close, is closed the library's way.
    """
    conn = engine.connect()
    await conn.start()
    ended = False
    try:
        yield conn
        ended = True
    finally:
        await _close(conn, ended)


@asynccontextmanager
async def begun(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """`engine.begin()`: a transaction, committed when the block ends normally, on a connection closed as `pooled`
    closes it (one context manager, not two: this is every write's path)."""
    conn = engine.connect()
    await conn.start()
    ended = False
    try:
        async with conn.begin():
            yield conn
        ended = True
    finally:
        await _close(conn, ended)


async def _close(conn: AsyncConnection, ended: bool) -> None:
    if ended and returns_without_io(conn.engine):
        await conn.close()
    else:
        await conn.__aexit__(None, None, None)  # the library's close: in a task of its own, shielded


def commit_each(conn: AsyncConnection) -> None:
    """SQLite, in a transaction `begun`: each statement from here on commits in its own trip (`sqlite_driver`), until
    SQLAlchemy's transaction ends. Nothing changes with the stock adapter or on PostgreSQL."""
    _mark(conn, "commit_each")


def commit_with_rows(conn: AsyncConnection) -> None:
    """SQLite: `conn`'s next statement commits its transaction in its own trip when it returns a row (`sqlite_driver`):
    for a transaction's last statement when the caller writes nothing more after it if it returned a row. Nothing
    changes with the stock adapter or on PostgreSQL (the COMMIT when the transaction's block ends)."""
    _mark(conn, "commit_with_rows")


def _mark(conn: AsyncConnection, name: str) -> None:
    adapter = conn.sync_connection.connection.dbapi_connection if conn.sync_connection is not None else None
    mark = getattr(adapter, name, None)
    if mark is not None:
        mark()


def returns_without_io(engine: AsyncEngine) -> bool:
    """Whether a connection of `engine` whose transaction is over goes back to its pool without being closed (a
    queue pool with an idle slot for it; other pools may close it on return)."""
    pool = engine.pool
    return isinstance(pool, QueuePool) and pool.checkedin() < pool.size()


def _one_trip() -> dict[str, Any]:
    """SQLite statements in one trip to the connection's thread (`sqlite_driver`), when the libraries allow."""
    dbapi = one_trip_dbapi()
    return {} if dbapi is None else {"module": dbapi}


def _sqlite_file(url: URL) -> Path | None:
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # The driver's own transaction handling is off: reads run in autocommit, and a write transaction is begun
    # explicitly (`_sqlite_begin_immediate`) instead of lazily before the first write.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        for pragma in SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def _sqlite_begin_immediate(conn: Any) -> None:
    dbapi_connection = conn.connection.dbapi_connection
    begin_immediate = getattr(dbapi_connection, "begin_immediate", None)
    if begin_immediate is not None:
        begin_immediate()  # `sqlite_driver`: begun with the transaction's first statement, in its trip
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


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


SQLITE_BUSY_MESSAGES = ("database is locked", "database table is locked", "database is busy")
POSTGRES_BUSY_STATES = frozenset({"53300", "57P03"})  # too many connections; the server is starting or stopping


def database_busy(exc: BaseException) -> bool:
    """Whether `exc` says the database could not take the statement now, not that anything is wrong with it: SQLite's
    lock held by another process past `busy_timeout`, no pooled connection free within `pool_timeout`, PostgreSQL
    out of connections or starting up. Worth answering "try again" (503) rather than "internal error"."""
    if isinstance(exc, SqlalchemyTimeout):  # the pool's wait for a connection
        return True
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(cause, sqlite3.OperationalError):
        return str(cause).startswith(SQLITE_BUSY_MESSAGES)
    return getattr(cause, "sqlstate", None) in POSTGRES_BUSY_STATES


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


def dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def load_json(text: str) -> Any:
    return json.loads(text)
