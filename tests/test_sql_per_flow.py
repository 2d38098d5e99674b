"""A connect flow costs a bounded number of SQL statements, on SQLite and on PostgreSQL.

Counted on the connector's engines (SQLAlchemy's `before_cursor_execute`; a transaction's BEGIN is not a
statement), from the agent's request to the completion told and settled, with the background work (sweeper,
heartbeat, event-log poll, webhooks, retention) set far apart so that only the flow's own statements fall in the
count. Counting is deterministic: the bound is exact, not a timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine.base import OptionEngine

from service import AuthorizationStatus
from service.testing import ScriptedBrowser

from .conftest import Deploy, Deployment
from .flow_support import Ask, asking, events

# What a flow costs, exactly: the agent's grant check, and per step its state change with its audit row (issue 32 aims
# at 8; what each statement is, is listed when a count differs). The flow row goes in with Continue's step, a user's
# first grant at the provider with the completion's (SQLite: carried by the step's note, migration 0021); asked
# again, the earlier grant is read in the completion's transaction and replaced by a statement of its own.
FIRST_GRANT = {"sqlite": 8, "postgresql": 8}
ASKED_AGAIN = {"sqlite": 10, "postgresql": 10}
# What a statement that writes a step's audit row says: on PostgreSQL it inserts the row (a data-modifying CTE); on
# SQLite it sets the step's note, whose row a trigger inserts (no INSERT of its own).
WRITES_AUDIT = {"postgresql": "INSERT INTO audit_events", "sqlite": "step_note"}

STEPS = ("created", "consented", "opened", "verified", "completed", "completion_sent")

# Background loops that would otherwise run during the counted flow.
QUIET = {
    "CONNECTOR_ELICITATION__SWEEP_INTERVAL_SECONDS": "3600",
    "CONNECTOR_EVENTS__POLL_INTERVAL_SECONDS": "60",
    "CONNECTOR_REPLICAS__HEARTBEAT_SECONDS": "600",
    "CONNECTOR_REPLICAS__DEAD_AFTER_SECONDS": "3600",
    "CONNECTOR_WEBHOOKS__POLL_INTERVAL_SECONDS": "60",
    "CONNECTOR_RETENTION__INTERVAL_SECONDS": "3600",
}


@contextmanager
def statements(deployment: Deployment) -> Iterator[list[str]]:
    """The SQL statements the connector runs inside the block (BEGIN left out), in order."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.lstrip().split(None, 1)[0].upper() != "BEGIN":
            seen.append(" ".join(statement.split()))

    db = deployment.connector.runtime.store.db
    # On PostgreSQL the reader is the writer with other options: it hears the writer's listeners already.
    engines = [e.sync_engine for e in (db.writer, db.reader) if not isinstance(e.sync_engine, OptionEngine)]
    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", record)


async def connect_flow(ask: Ask, browser: ScriptedBrowser, scope: str) -> str:
    """One whole flow: the agent asks, the client accepts, the browser opens, continues, signs in, comes back."""
    pending = await ask(scopes=(scope,))
    page = await browser.get(pending.url)
    assert page.status_code == 200, page.text
    done = await browser.follow(await browser.submit(page, "continue"))
    assert done.status_code == 200, done.text
    assert (await pending.outcome()).status is AuthorizationStatus.AUTHORIZED
    async with asyncio.timeout(10):
        while pending.client.completions != [pending.elicitation_id]:  # noqa: ASYNC110 - a list the client fills
            await asyncio.sleep(0.01)
    return pending.elicitation_id


async def settled(seen: list[str]) -> None:
    """Wait until no statement has come for a moment (the completion's telling is settled after it is sent)."""
    count = -1
    while count != len(seen):
        count = len(seen)
        await asyncio.sleep(0.3)


async def test_a_connect_flow_runs_a_bounded_number_of_statements(deploy_with: Deploy, database_url: str) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url, **QUIET) as deployment:
        store = deployment.connector.runtime.store
        backend = store.db.writer.dialect.name
        async with asking(deployment) as ask, ScriptedBrowser() as browser:
            await connect_flow(ask, browser, "warm-up")  # discovery, caches and the first background ticks
            for grant in await store.grants.find(deployment.local_user, "github"):
                assert await store.grants.delete(grant.id)
            await asyncio.sleep(0.5)
            with statements(deployment) as first:
                ids = [await connect_flow(ask, browser, "first")]
                await settled(first)
            with statements(deployment) as again:
                ids.append(await connect_flow(ask, browser, "again"))
                await settled(again)
        (grant,) = await store.grants.find(deployment.local_user, "github")
        assert set(grant.scopes) == {"first", "again"}
        for elicitation_id in ids:  # each step's audit row, written with the step (in its statement or beside it)
            assert sorted(await events(deployment, elicitation_id)) == sorted(STEPS), elicitation_id
    for seen, bound in ((first, FIRST_GRANT), (again, ASKED_AGAIN)):
        listing = "\n".join(seen)
        assert len(seen) == bound[backend], f"{len(seen)} statements on {backend}:\n{listing}"
        assert sum(WRITES_AUDIT[backend] in s for s in seen) == len(STEPS), listing
