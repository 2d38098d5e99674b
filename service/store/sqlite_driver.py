"""SQLite statements in one trip to the connection's thread.

aiosqlite runs each SQLite connection on its own thread, and SQLAlchemy's adapter makes four trips there for one
statement (open a cursor, execute, fetch, close). Each trip is a hand-off between threads (a queue, a wake-up of
the event loop, the GIL), which under load costs far more than the statement itself. This adapter runs the whole
statement (cursor, execute, fetch, close) as one function on that thread, and skips the trip for a rollback when
no transaction is open. A write transaction's `BEGIN IMMEDIATE` is not a trip of its own either: `begin_immediate()`
only marks the connection, and the transaction's first statement begins it on the thread, in its own trip. So a
read is one trip, and a write transaction its statements and the COMMIT. A connection marked `commit_each()` (a
write whose statements are each their own transaction: `Database.write_alone`) runs `BEGIN IMMEDIATE`, the statement
and its COMMIT in the one trip, or its ROLLBACK when the statement or the COMMIT fails, so SQLite's transaction never
outlives the trip; the COMMIT SQLAlchemy asks for afterwards finds none open and costs no trip. A transaction's last
statement may carry its COMMIT too (`commit_with_rows()`: when it returns a row, the caller having nothing more to
write then; a statement that returns none leaves the transaction open for what the caller does instead). It is handed to
SQLAlchemy's own aiosqlite dialect as its DBAPI module (`create_async_engine(..., module=one_trip_dbapi())`), and
changes nothing else.

It relies on `aiosqlite.Connection._execute` (run a function on the connection's thread, as SQLAlchemy's adapter
itself does for `isolation_level`), its `_connection` (the sqlite3 connection) and SQLAlchemy's aiosqlite adapter
classes; `one_trip_dbapi()` returns None when they are not as expected, and the store then uses the stock adapter.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from typing import Any

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
)
from sqlalchemy.util import EMPTY_DICT


class _Done:
    """What is left of a statement after its one trip: the cursor attributes SQLAlchemy reads."""

    __slots__ = ("description", "lastrowid", "rowcount")

    def __init__(self, description: Any = None, rowcount: int = -1, lastrowid: int | None = None) -> None:
        self.description = description
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    def close(self) -> None:
        return None


BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"


COMMIT_ALWAYS, COMMIT_IF_ROWS = 1, 2  # `commit` of a trip: 0, the statement is one of its transaction's


def _run(
    conn: sqlite3.Connection, operation: str, parameters: Any, many: bool, begin: bool, commit: int
) -> tuple[_Done, list[Any]]:
    cursor = conn.cursor()
    try:
        if begin:
            cursor.execute(BEGIN_IMMEDIATE)
        try:
            if many:
                cursor.executemany(operation, parameters)
            else:
                cursor.execute(operation, () if parameters is None else parameters)
            rows = cursor.fetchall() if cursor.description else []
            if commit == COMMIT_ALWAYS or (commit == COMMIT_IF_ROWS and rows):
                conn.commit()
        except BaseException:
            if commit and conn.in_transaction:  # a transaction its trip may end ends with it, either way
                conn.rollback()
            raise
        return _Done(cursor.description, cursor.rowcount, cursor.lastrowid), rows
    finally:
        cursor.close()


class _OneTripCursor(AsyncAdapt_aiosqlite_cursor):
    __slots__ = ()
    _awaitable_cursor_close = False

    def __init__(self, adapt_connection: Any) -> None:
        self._adapt_connection = adapt_connection
        self._connection = adapt_connection._connection
        self._cursor = _Done()  # type: ignore[assignment]
        self._soft_closed_memoized = EMPTY_DICT
        self._rows = deque()

    async def _execute_async(self, operation: Any, parameters: Any) -> Any:
        return await self._trip(operation, parameters, many=False)

    async def _executemany_async(self, operation: Any, seq_of_parameters: Any) -> Any:
        return await self._trip(operation, seq_of_parameters, many=True)

    async def _trip(self, operation: Any, parameters: Any, *, many: bool) -> None:
        adapt: _OneTripConnection = self._adapt_connection  # type: ignore[assignment]
        async with adapt._execute_mutex:
            # Taken before the trip: if BEGIN fails there is no transaction, and if the statement fails the
            # transaction is open and the rollback (which asks SQLite, not this flag) ends it.
            commit = COMMIT_ALWAYS if adapt.committing else COMMIT_IF_ROWS if adapt.commit_if_rows else 0
            adapt.commit_if_rows = False
            begin, adapt.begin_pending = adapt.begin_pending or adapt.committing, False
            connection = self._connection
            if begin or commit:
                # Until this trip comes back, SQLite may begin or end the transaction at any moment: a caller
                # cancelled meanwhile must roll back through the thread (after the trip), not skip it.
                adapt.begin_unsettled = True
            try:
                done, rows = await connection._execute(
                    _run, connection._connection, operation, parameters, many, begin, commit
                )
            except asyncio.CancelledError:
                raise  # the trip may still be running: unsettled
            except BaseException:
                adapt.begin_unsettled = False  # the trip is over: SQLite says whether a transaction is open
                raise
            adapt.begin_unsettled = False
        self._cursor = done
        self._rows = deque(rows)


class _OneTripConnection(AsyncAdapt_aiosqlite_connection):
    __slots__ = ("begin_pending", "begin_unsettled", "commit_if_rows", "committing")
    _cursor_cls = _OneTripCursor

    def __init__(self, dbapi: Any, connection: Any) -> None:
        super().__init__(dbapi, connection)
        self.begin_pending = False
        self.begin_unsettled = False
        self.committing = False
        self.commit_if_rows = False

    def begin_immediate(self) -> None:
        """Begin a write transaction (`BEGIN IMMEDIATE`) with the next statement, in its trip."""
        self.begin_pending = True
        self.committing = self.commit_if_rows = False

    def commit_each(self) -> None:
        """Until SQLAlchemy's transaction ends: each statement is a write transaction of its own, begun (`BEGIN
        IMMEDIATE`) and committed in its trip, rolled back there if it fails."""
        self.committing = True

    def commit_with_rows(self) -> None:
        """The next statement (one of an open transaction's, in SQLAlchemy's) ends the transaction when it returns a
        row: COMMIT in its trip; else the transaction stays open. A failing statement rolls back in its trip."""
        self.commit_if_rows = True

    def commit(self) -> None:
        self.committing = self.commit_if_rows = False
        if self.begin_pending:  # begun, but no statement ran: there is nothing to commit
            self.begin_pending = False
            return
        if self._nothing_open():  # committed in the statements' trips (`commit_each`, `commit_with_rows`)
            return
        super().commit()

    def rollback(self) -> None:
        self.begin_pending = False
        self.committing = self.commit_if_rows = False
        # Reads run in autocommit and the pool resets a connection after its commit: most rollbacks find no
        # transaction.
        if self._nothing_open():
            return
        self.begin_unsettled = False
        super().rollback()

    def _nothing_open(self) -> bool:
        """SQLite has no transaction open on this connection, so a COMMIT or ROLLBACK would be a no-op and needs no
        trip. `in_transaction` is a flag read that SQLite allows from any thread; nothing else runs on the connection
        meanwhile, unless a cancelled caller left a trip that begins or ends a transaction on its way
        (`begin_unsettled`): then the COMMIT or ROLLBACK is queued behind it."""
        connection = self._connection._connection
        return connection is not None and not connection.in_transaction and not self.begin_unsettled


class _OneTripDbapi(AsyncAdapt_aiosqlite_dbapi):
    def connect(self, *arg: Any, **kw: Any) -> AsyncAdapt_aiosqlite_connection:
        stock = super().connect(*arg, **kw)
        return _OneTripConnection(self, stock._connection)


def one_trip_dbapi() -> Any | None:
    """The DBAPI module to give SQLAlchemy's aiosqlite dialect; None when the libraries are not as expected."""
    connection = getattr(aiosqlite, "Connection", None)
    if connection is None or not callable(getattr(connection, "_execute", None)):
        return None
    if not hasattr(AsyncAdapt_aiosqlite_cursor, "_execute_async"):
        return None
    return _OneTripDbapi(aiosqlite, sqlite3)
