"""A database too busy to take a request's statement (SQLite's lock held by another process past `busy_timeout`, no
pooled connection free within `pool_timeout`, PostgreSQL out of connections): a 503 with the stable code
`database_busy`, Retry-After and a sentence, on the pages and under /v1; never a 500 with a stack in the log; nothing
half written; and the same request succeeds once the database is free."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from service.store import Store, database_busy, engine
from service.store.tables import elicitations

from .api_support import api_client, create_body, make_key
from .conftest import Deploy, fresh_postgres_database

LOCK_HOLDER = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite gives up on another process's lock after 0.1 s instead of 5 s (the connector's connections only)."""
    pragmas = tuple(
        "PRAGMA busy_timeout=100" if p.startswith("PRAGMA busy_timeout") else p for p in engine.SQLITE_PRAGMAS
    )
    monkeypatch.setattr(engine, "SQLITE_PRAGMAS", pragmas)


@asynccontextmanager
async def locked_by_another_process(database_url: str) -> AsyncIterator[None]:
    """SQLite's write lock held by a process of its own (as a CLI command's long transaction would) for the block."""
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LOCK_HOLDER,
        make_url(database_url).database or "",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert await asyncio.wait_for(holder.stdout.readline(), 10) == b"locked\n"
        yield
    finally:
        holder.stdin.close()
        await asyncio.wait_for(holder.wait(), 10)


async def elicitation_count(store: Store) -> int:
    async with store.db.read() as conn:
        return int((await conn.execute(select(func.count()).select_from(elicitations))).scalar_one())


def assert_busy(response: httpx.Response) -> None:
    assert response.status_code == 503, (response.request.url, response.status_code, response.text)
    assert response.headers["retry-after"] == "1"
    assert "Traceback" not in response.text


@contextmanager
def no_server_error_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    yield
    messages = [record.getMessage() for record in caplog.records]
    assert any(message.startswith("the database was busy on ") for message in messages), messages
    assert not any("unhandled error" in message for message in messages)
    assert all(record.exc_info is None for record in caplog.records if record.name.startswith("service"))


@pytest.mark.duration(4)
async def test_sqlite_locked_by_another_process_answers_503_then_the_request_succeeds(
    deploy_with: Deploy, short_busy_timeout: None, captured_logs: pytest.LogCaptureFixture
) -> None:
    async with deploy_with() as deployment:
        store = deployment.connector.runtime.store
        key = await make_key(store)
        user = deployment.local_user
        async with api_client(deployment.base_url, key) as api:
            first = await api.post("/v1/elicitations", json=create_body(user))
            assert first.status_code == 201, first.text
            connect_url = first.json()["url"]
            before = await elicitation_count(store)
            with no_server_error_logged(captured_logs):
                async with locked_by_another_process(str(store.db.url)):
                    created = await api.post("/v1/elicitations", json=create_body(user, scope=_scope("call-2")))
                    page = await api.get(connect_url)
            assert_busy(created)
            assert created.json()["error"]["code"] == "database_busy"
            assert "retry after Retry-After" in created.json()["error"]["message"]
            assert_busy(page)
            assert page.headers["x-connector-error"] == "database_busy"
            assert "too busy to finish this step right now" in page.text
            assert await elicitation_count(store) == before  # nothing half written

            again = await api.post("/v1/elicitations", json=create_body(user, scope=_scope("call-2")))
            assert again.status_code == 201, again.text
            assert (await api.get(connect_url)).status_code == 200


async def test_no_writer_free_within_the_pool_timeout_answers_503(
    deploy_with: Deploy, captured_logs: pytest.LogCaptureFixture
) -> None:
    async with deploy_with(CONNECTOR_DATABASE__POOL_TIMEOUT_SECONDS="0.2") as deployment:
        store = deployment.connector.runtime.store
        key = await make_key(store)
        async with api_client(deployment.base_url, key) as api:
            with no_server_error_logged(captured_logs):
                async with store.transaction():  # this process's one SQLite writer, held past the pool's timeout
                    created = await api.post("/v1/elicitations", json=create_body(deployment.local_user))
            assert_busy(created)
            assert created.json()["error"]["code"] == "database_busy"
            assert (await api.post("/v1/elicitations", json=create_body(deployment.local_user))).status_code == 201


async def test_postgresql_out_of_connections_is_busy_and_other_errors_are_not() -> None:
    """On the real server: a role over its connection limit is refused with SQLSTATE 53300, which is busy; a
    constraint violation is a bug's error, not busy."""
    role = f"connector_busy_{uuid.uuid4().hex[:8]}"
    async with fresh_postgres_database(migrated=True) as url:
        admin = create_async_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        limited = create_async_engine(make_url(url).set(username=role), poolclass=NullPool)
        try:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
            with pytest.raises(DBAPIError) as refused:
                async with limited.connect():
                    pass
            assert database_busy(refused.value), refused.value
            with pytest.raises(DBAPIError) as violated:
                async with admin.connect() as conn:
                    await conn.exec_driver_sql("INSERT INTO elicitations (id) VALUES (NULL)")
            assert not database_busy(violated.value)
        finally:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{role}"')
            await limited.dispose()
            await admin.dispose()


def _scope(tool_call_id: str) -> dict[str, Any]:
    return {"sessionId": "sess-1", "toolCallId": tool_call_id}
