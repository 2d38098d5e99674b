"""Retention on PostgreSQL reads only the rows it deletes: a pass with nothing past its window is an index scan that
finds nothing, whatever the planner's statistics say and whichever plan a prepared statement gets.

The tables are seeded by the server (half of each kind's rows past its window), analysed, and kept from autovacuum:
after the purge the statistics still say half the rows are old, as they do in production until autovacuum runs
again. Each kind's batch is then explained (`EXPLAIN ANALYZE`) with the custom plan and with the generic plan that
asyncpg's prepared statement gets after its fifth run, sequential scans off (on tables this small the planner would
rather read them whole than fetch 500 ids by the primary key; on a big one it would not). Ordering a batch by the
primary key instead of the window's index makes the planner walk the primary key, filtering out every remaining row;
without an index on the window's column it filters every row the status or another index gives (what this catches).
"""

# ruff: noqa: S608  (the SQL here is built from constants of this module, never from input)
from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Delete
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from service.core.retention import PurgeKind, RetentionPolicy, count_due, purge_due
from service.store import Store
from service.store.retention import purge_batch

from .conftest import fresh_postgres_database

pytestmark = pytest.mark.postgres

ROWS = 20_000  # per table; half of them past the window
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
POLICY = RetentionPolicy(batch_size=500)  # the default windows: 30, 7, 365, 7 and 7 days
TABLES = {
    PurgeKind.ELICITATIONS: "elicitations",
    PurgeKind.VERIFICATIONS: "identity_verifications",
    PurgeKind.AUDIT: "audit_events",
    PurgeKind.EVENTS: "elicitation_events",
    PurgeKind.WEBHOOK_DELIVERIES: "webhook_deliveries",
}
INDEXED = {"Index Scan", "Index Only Scan", "Bitmap Heap Scan"}  # the ways to read a table by an index
# Row i is `age(i)` old: the odd ones past every window (400-800 days), the even ones within all (0-1 days).
AGE = "CASE WHEN i % 2 = 1 THEN interval '400 days' + i * interval '1 hour' ELSE i * interval '1 second' END"
SEED = [
    f"""INSERT INTO elicitations (id, connection_key, identity_issuer, identity_subject, provider, scopes,
        scope_kind, agent_name, message, status, created_at, expires_at, updated_at)
    SELECT 'e' || i, 'conn', 'https://idp.test', 'user' || (i % 1000), 'github', '["read"]', 'session', 'Agent',
        'm', CASE WHEN i % 2 = 1 THEN 'completed' ELSE 'pending' END, :now - ({AGE}), :now - ({AGE}) + interval
        '10 minutes', :now - ({AGE})
    FROM generate_series(1, {ROWS}) AS i""",
    f"""INSERT INTO identity_verifications (id, elicitation_id, verifier, handle_hash, browser_binding_hash,
        created_at, expires_at)
    SELECT 'v' || i, 'e' || (2 * (1 + i % 1000)), 'oidc', 'h' || i, 'b', :now - ({AGE}), :now - ({AGE})
    FROM generate_series(1, {ROWS}) AS i""",
    f"""INSERT INTO audit_events (at, event, elicitation_id, identity_issuer, identity_subject, provider, detail)
    SELECT :now - ({AGE}), 'completed', 'e' || i, 'https://idp.test', 'user' || (i % 1000), 'github', '{{}}'
    FROM generate_series(1, {ROWS}) AS i""",
    f"""INSERT INTO elicitation_events (elicitation_id, connection_key, status, at, origin)
    SELECT 'e' || i, 'conn', 'completed', :now - ({AGE}), 'r1' FROM generate_series(1, {ROWS}) AS i""",
    """INSERT INTO webhook_endpoints (id, tenant, url, secret_key_id, secret_ciphertext, after_event_id, created_at)
    VALUES ('w1', 't1', 'https://hooks.test/1', 'k1', '\\x00'::bytea, 0, :now)""",
    f"""INSERT INTO webhook_deliveries (id, endpoint_id, event_id, elicitation_id, body, status, attempts,
        last_attempt_at, created_at)
    SELECT 'd' || i, 'w1', i, 'e' || i, '{{}}', 'delivered', 1, :now - ({AGE}), :now - ({AGE})
    FROM generate_series(1, {ROWS}) AS i""",
]


async def seed(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        for table in TABLES.values():
            await conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        for statement in SEED:
            await conn.exec_driver_sql(statement.replace(":now", "$1::timestamptz"), (NOW,))
        await conn.exec_driver_sql("ANALYZE")


async def explain(engine: AsyncEngine, statement: Delete, *, generic: bool) -> dict[str, Any]:
    """`EXPLAIN ANALYZE` of the statement as the store sends it (bound parameters), with the custom or generic plan."""
    async with engine.connect() as conn:
        compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        params = [compiled.params[name] for name in compiled.positiontup or ()]
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        await raw.execute(f"SET plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
        await raw.execute("SET enable_seqscan = off")  # 20,000 rows: a big table's plan, not a small one's
        document = await raw.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled}", *params)
    plan: dict[str, Any] = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    return plan


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


async def test_a_retention_pass_with_nothing_left_to_delete_reads_no_row() -> None:
    async with fresh_postgres_database(migrated=True) as url:
        engine = create_async_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        store = Store.from_url(url)
        try:
            await seed(engine)
            due = await count_due(store.retention, POLICY, NOW)
            assert due == dict.fromkeys(TABLES, ROWS // 2)
            assert await purge_due(store.retention, POLICY, NOW) == due
            assert await count_due(store.retention, POLICY, NOW) == dict.fromkeys(TABLES, 0)

            for kind, window in POLICY.windows().items():
                for generic in (False, True):
                    plan = await explain(
                        engine, purge_batch(kind, NOW - window, limit=500, dialect="postgresql"), generic=generic
                    )
                    scans = [
                        node
                        for node in nodes(plan)
                        if node.get("Relation Name") == TABLES[kind] and node["Node Type"] != "ModifyTable"
                    ]
                    where = f"{kind} ({'generic' if generic else 'custom'} plan): {json.dumps(plan)}"
                    assert scans, where
                    assert all(node["Node Type"] in INDEXED for node in scans), where
                    # Live rows returned or filtered out. (An index scan right after the purge may still visit the
                    # index entries of the rows it deleted, until the first scan marks them dead or vacuum removes
                    # them: "Heap Fetches", as many as were just deleted, whatever the table's size.)
                    read = sum(node["Actual Rows"] + node.get("Rows Removed by Filter", 0) for node in scans)
                    assert read == 0, where
        finally:
            await store.close()
            await engine.dispose()
