"""The store's connections: returned to the pool in the caller's task when a block ends normally (no task of its own,
no cancellation can reach the close half way), the library's shielded close otherwise; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from service.store import Store, migrate
from service.store.engine import Database, PoolSettings, begun, pooled, returns_without_io

from .conftest import fresh_postgres_database


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'connector.db'}"
        migrate(url)
        yield url
        return
    async with fresh_postgres_database(migrated=True) as url:
        yield url


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database.from_url(database_url, PoolSettings(size=2, overflow=2, timeout=5))
    async with begun(database.writer) as conn:
        await conn.execute(text("CREATE TABLE scratch (n INTEGER)"))
    try:
        yield database
    finally:
        await database.dispose()


@contextmanager
def tasks_created() -> Generator[list[Coroutine[Any, Any, Any]], None, None]:
    """The coroutines the running loop was given as tasks inside the block."""
    loop = asyncio.get_running_loop()
    created: list[Coroutine[Any, Any, Any]] = []
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        yield created
    finally:
        loop.set_task_factory(previous)


async def test_a_read_and_a_write_that_end_normally_return_their_connection_without_a_task(db: Database) -> None:
    with tasks_created() as created:
        async with db.read() as conn:
            await conn.execute(text("SELECT count(*) FROM scratch"))
        async with db.write() as conn:
            await conn.execute(text("INSERT INTO scratch VALUES (1)"))
    assert created == []
    assert db.writer.pool.checkedout() == 0
    async with db.read() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM scratch"))).scalar() == 1


async def test_a_block_that_raises_rolls_back_and_closes_the_librarys_way(db: Database) -> None:
    with tasks_created() as created, pytest.raises(RuntimeError, match="boom"):
        async with db.write() as conn:
            await conn.execute(text("INSERT INTO scratch VALUES (1)"))
            raise RuntimeError("boom")
    assert len(created) == 1  # the shielded close
    assert db.writer.pool.checkedout() == 0
    async with db.read() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM scratch"))).scalar() == 0


async def test_a_block_cancelled_while_it_waits_returns_its_connection(db: Database) -> None:
    entered = asyncio.Event()

    async def held() -> None:
        async with db.write() as conn:
            await conn.execute(text("INSERT INTO scratch VALUES (1)"))
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(held())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert db.writer.pool.checkedout() == 0
    async with db.write() as conn:  # the writer is free, and nothing of the cancelled block was kept
        await conn.execute(text("INSERT INTO scratch VALUES (2)"))
    async with db.read() as conn:
        assert (await conn.execute(text("SELECT n FROM scratch"))).scalars().all() == [2]


@pytest.mark.parametrize("kind", ["read", "write"])
async def test_after_a_normal_block_the_close_awaits_nothing(db: Database, kind: str) -> None:
    """What makes the close in the caller's task safe: it completes in one step, so no cancellation can reach it half
    way (asserted for the installed SQLAlchemy and drivers)."""
    engine = db.reader if kind == "read" else db.writer
    conn = engine.connect()
    await conn.start()
    if kind == "read":
        await conn.execute(text("SELECT count(*) FROM scratch"))
    else:
        async with conn.begin():
            await conn.execute(text("INSERT INTO scratch VALUES (1)"))
    assert returns_without_io(engine)
    closing = conn.close()
    with pytest.raises(StopIteration):
        closing.send(None)
    assert engine.pool.checkedout() == 0


async def test_a_connection_the_pool_will_close_is_closed_the_librarys_way(db: Database) -> None:
    """With every pooled slot idle the pool closes a returned overflow connection, which is I/O: the library's way."""
    size = db.reader.pool.size()  # type: ignore[attr-defined]
    with tasks_created() as created:
        async with pooled(db.reader) as first, pooled(db.reader) as second:
            async with pooled(db.reader) as overflow:
                for conn in (first, second, overflow):
                    await conn.execute(text("SELECT 1"))
                assert db.reader.pool.checkedout() == size + 1
            assert len(created) == 0  # a pooled slot was free for the first one returned
        assert len(created) == 1  # the last one returned found every slot idle: closed in its own task
    assert db.reader.pool.checkedout() == 0
    assert db.reader.pool.checkedin() == size  # type: ignore[attr-defined]


async def test_the_store_transaction_uses_the_same_close(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'connector.db'}"
    migrate(url)
    store = Store.from_url(url)
    try:
        with tasks_created() as created:
            async with store.transaction() as conn:
                await conn.execute(text("SELECT 1"))
        assert created == []
    finally:
        await store.close()


# -- a write whose statements are each their own transaction (`Database.write_alone`) -------------------------------
@contextmanager
def trips_counted() -> Generator[list[str], None, None]:
    """The functions run on SQLite connections' threads (aiosqlite's `_execute`) inside the block, by name."""
    import aiosqlite

    trips: list[str] = []
    original = aiosqlite.Connection._execute

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return await original(self, fn, *args, **kwargs)

    aiosqlite.Connection._execute = counted  # type: ignore[method-assign]
    try:
        yield trips
    finally:
        aiosqlite.Connection._execute = original  # type: ignore[method-assign]


async def _scratch(db: Database) -> list[int]:
    async with db.read() as conn:
        return list((await conn.execute(text("SELECT n FROM scratch ORDER BY n"))).scalars().all())


async def _writer_in_transaction(db: Database) -> bool:
    """Whether SQLite's writer connection has a transaction open (it must not, between uses)."""
    async with pooled(db.writer) as conn:
        raw = await conn.get_raw_connection()
        return bool(raw.driver_connection._connection.in_transaction)  # type: ignore[union-attr]


async def test_a_write_alone_statement_commits_in_its_own_trip(db: Database) -> None:
    with trips_counted() as trips:
        async with db.write_alone() as conn:
            await conn.execute(text("INSERT INTO scratch VALUES (1)"))
    if db.dialect == "sqlite":
        assert trips == ["_run"]  # BEGIN IMMEDIATE, the statement and its COMMIT: one trip, no COMMIT of its own
        assert not await _writer_in_transaction(db)
        with trips_counted() as trips:
            async with db.write() as conn:
                await conn.execute(text("INSERT INTO scratch VALUES (2)"))
        assert trips == ["_run", "commit"]  # a transaction of the usual kind: its COMMIT is a trip
    assert await _scratch(db) == ([1, 2] if db.dialect == "sqlite" else [1])


async def test_a_write_alone_statement_stands_when_the_block_raises_after_it(db: Database) -> None:
    """Each statement is its own transaction, as in PostgreSQL's AUTOCOMMIT: what the block does after it cannot
    undo it (so only steps whose Python decides nothing after their statement use it)."""
    with pytest.raises(RuntimeError, match="boom"):
        async with db.write_alone() as conn:
            await conn.execute(text("INSERT INTO scratch VALUES (1)"))
            raise RuntimeError("boom")
    assert await _scratch(db) == [1]
    assert db.writer.pool.checkedout() == 0


async def test_a_failing_write_alone_statement_leaves_nothing_and_no_transaction(db: Database) -> None:
    async with db.write() as conn:
        await conn.execute(text("CREATE TABLE once (n INTEGER PRIMARY KEY)"))
    with trips_counted() as trips, pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        async with db.write_alone() as conn:
            await conn.execute(text("INSERT INTO once VALUES (1), (1)"))  # the first row goes in, the second fails
    if db.dialect == "sqlite":
        assert trips == ["_run"]  # rolled back in the statement's trip: the block's rollback finds nothing open
    async with db.read() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM once"))).scalar() == 0
    if db.dialect == "sqlite":
        assert not await _writer_in_transaction(db)
    async with db.write() as conn:  # the writer is usable
        await conn.execute(text("INSERT INTO once VALUES (2)"))


async def test_after_a_write_alone_the_next_transaction_commits_only_at_its_end(db: Database) -> None:
    """The connection goes back to the pool as it came: the next transaction's first statement does not commit."""
    async with db.write_alone() as conn:
        await conn.execute(text("INSERT INTO scratch VALUES (1)"))
    with pytest.raises(RuntimeError, match="boom"):
        async with db.write() as conn:
            await conn.execute(text("INSERT INTO scratch VALUES (2)"))
            raise RuntimeError("boom")
    assert await _scratch(db) == [1]


# A statement that keeps SQLite's thread busy for a while: a cancellation arrives while its trip is in flight.
_SLOW_INSERT = text(
    "INSERT INTO scratch SELECT 1 FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
    "WHERE x < 3000000) SELECT max(x) FROM c)"
)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # SQLite's trips
@pytest.mark.parametrize("way", ["write_alone", "last statement"])
async def test_cancelled_while_the_trip_that_commits_is_in_flight_leaves_no_half_state(db: Database, way: str) -> None:
    from service.store.engine import commit_with_rows

    started = asyncio.Event()

    async def write() -> None:
        if way == "write_alone":
            async with db.write_alone() as conn:
                started.set()
                await conn.execute(_SLOW_INSERT)
        else:
            async with db.write() as conn:
                await conn.execute(text("INSERT INTO scratch VALUES (2)"))
                commit_with_rows(conn)
                started.set()
                await conn.execute(text(f"{_SLOW_INSERT.text} RETURNING n"))

    task = asyncio.create_task(write())
    await started.wait()
    await asyncio.sleep(0.05)  # the trip is on SQLite's thread
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert db.writer.pool.checkedout() == 0
    assert not await _writer_in_transaction(db)
    async with db.write() as conn:  # the writer is usable, and its next transaction is of the usual kind
        await conn.execute(text("INSERT INTO scratch VALUES (3)"))
    rows = await _scratch(db)
    # The trip ran to its end on the thread: all of the transaction committed, or (had it not begun) none of it.
    assert rows in ([1, 3], [1, 2, 3], [3])
    assert (2 in rows) == (1 in rows) or way == "write_alone"


async def test_a_last_statement_commits_in_its_trip_only_when_it_returns_a_row(db: Database) -> None:
    from service.store.engine import commit_with_rows

    with trips_counted() as trips:
        async with db.write() as conn:
            await conn.execute(text("INSERT INTO scratch VALUES (1)"))
            commit_with_rows(conn)
            returned = (await conn.execute(text("INSERT INTO scratch VALUES (2) RETURNING n"))).scalar()
    assert returned == 2
    if db.dialect == "sqlite":
        assert trips == ["_run", "_run"]  # the second statement carried the COMMIT
    assert await _scratch(db) == [1, 2]
    # No row returned: the transaction stays open for what the caller writes instead, and ends with the block (the
    # mark was for that one statement only).
    with pytest.raises(RuntimeError, match="boom"):
        async with db.write() as conn:
            commit_with_rows(conn)
            await conn.execute(text("UPDATE scratch SET n = n + 10 WHERE n = 99 RETURNING n"))
            await conn.execute(text("INSERT INTO scratch VALUES (3) RETURNING n"))
            raise RuntimeError("boom")
    assert await _scratch(db) == [1, 2]
    async with db.write() as conn:
        commit_with_rows(conn)
        await conn.execute(text("UPDATE scratch SET n = n + 10 WHERE n = 99 RETURNING n"))
        await conn.execute(text("INSERT INTO scratch VALUES (3)"))
    assert await _scratch(db) == [1, 2, 3]
