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
