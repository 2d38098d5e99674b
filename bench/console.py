"""The operator console under load: 1,000,000 grants and 10,000,000 audit rows on PostgreSQL, each page timed.

    .venv/bin/python -m bench.console [--quick] [--grants N] [--audit N] [--requests N]

Needs BENCH_POSTGRES_URL (or CONNECTOR_TEST_POSTGRES_URL): a scratch database is created, and dropped at the end.
The rows are made by the server itself (`INSERT ... SELECT ... FROM generate_series`) on the schema without the
console's indexes; then migration 0017's indexes are built (timed: what the upgrade costs on such a database) and
the tables vacuumed and analysed, as autovacuum would leave them. The connector serves on loopback; each page is
fetched `--requests` times one after another, with the operator API key, after two warm-up fetches: the median,
95th percentile and slowest answer, whole HTTP round trips, and the first fetch alone (for the overview and the keys
page it counts the whole grants table: their counts are a snapshot, `admin.counts_max_age_seconds`). Deep pages
start from a cursor near the end of the list (the 90 %th row): keyset paging costs there what it costs on page 1.

Data shape: 200,000 users, 5 providers, 4 tenants, 1 % of grants needing the user, 0.3 % backing off; audit rows
100 ms apart over 8 event names; 100,000 elicitations (1 % open); 10 webhook endpoints with 100,000 deliveries (1 %
waiting).
"""

# ruff: noqa: S608  (the SQL here is built from integers and constants of this script, never from input)
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import secrets
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bench.harness import REPO, free_port, machine, median, percentile, postgres_database
from service.core.paging import Position
from service.store import migrate
from service.vault import generate_key

OPERATOR_KEY = "bench-operator-" + secrets.token_urlsafe(32)
PROVIDERS = "ARRAY['github','google','slack','notion','linear']"
EVENTS = "ARRAY['created','opened','verified','completed','refreshed','refresh_failed','expired','disconnected']"


def console_indexes() -> list[tuple[str, str, list[str], str | None]]:
    path = REPO / "migrations" / "versions" / "0017_console_indexes.py"
    spec = importlib.util.spec_from_file_location("console_indexes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.INDEXES)


async def seed(engine: AsyncEngine, grants: int, audit: int) -> list[tuple[str, float]]:
    """The rows, then the console's indexes; (step, seconds) of each."""
    steps: list[tuple[str, float]] = []
    statements = [
        (
            f"{grants:,} grants",
            f"""INSERT INTO grants (id, identity_issuer, identity_subject, provider, provider_account_id, scopes,
                token_key_id, token_ciphertext, token_expires_at, created_at, updated_at, health_status,
                health_reason, health_changed_at, last_refresh_at, refresh_failures, next_refresh_at, tenant)
            SELECT 'g' || lpad(i::text, 12, '0'), 'https://idp.bench', 'user' || (i % 200000),
                ({PROVIDERS})[1 + i % 5], 'acct' || i, '["read"]', CASE WHEN i % 50 = 0 THEN 'k0' ELSE 'k1' END,
                '\\x00'::bytea, now() + interval '1 hour', now() - i * interval '1 second',
                now() - i * interval '1 second',
                CASE WHEN i % 100 = 0 THEN 'needs_user' END, CASE WHEN i % 100 = 0 THEN 'revoked' END,
                CASE WHEN i % 100 = 0 THEN now() END, now() - i * interval '1 second',
                CASE WHEN i % 333 = 0 THEN 2 END, CASE WHEN i % 333 = 0 THEN now() + interval '1 minute' END,
                'tenant' || (i % 4)
            FROM generate_series(1, {grants}) AS i""",
        ),
        (
            f"{audit:,} audit rows",
            f"""INSERT INTO audit_events (at, event, elicitation_id, identity_issuer, identity_subject, provider,
                detail)
            SELECT now() - i * interval '100 milliseconds', ({EVENTS})[1 + i % 8], 'e' || (i % 100000),
                'https://idp.bench', 'user' || (i % 200000), ({PROVIDERS})[1 + i % 5], '{{"n": 1}}'
            FROM generate_series(1, {audit}) AS i""",
        ),
        (
            "100,000 elicitations",
            f"""INSERT INTO elicitations (id, connection_key, identity_issuer, identity_subject, provider, scopes,
                scope_kind, agent_name, message, status, created_at, expires_at, updated_at)
            SELECT 'e' || i, 'conn', 'https://idp.bench', 'user' || (i % 200000), ({PROVIDERS})[1 + i % 5],
                '["read"]', 'session', 'Bench agent', 'bench',
                CASE WHEN i % 100 = 0 THEN 'pending' ELSE 'completed' END, now() - i * interval '1 second',
                now() - i * interval '1 second' + interval '10 minutes', now() - i * interval '1 second'
            FROM generate_series(1, 100000) AS i""",
        ),
        (
            "10 webhook endpoints, 100,000 deliveries",
            """INSERT INTO webhook_endpoints (id, tenant, url, secret_key_id, secret_ciphertext, after_event_id,
                created_at)
            SELECT 'w' || i, 'tenant' || i, 'https://hooks.bench/' || i, 'k1', '\\x00'::bytea, 0,
                now() - i * interval '1 day'
            FROM generate_series(1, 10) AS i;
            INSERT INTO webhook_deliveries (id, endpoint_id, event_id, elicitation_id, body, status, attempts,
                created_at)
            SELECT 'd' || i, 'w' || (1 + i % 10), i, 'e' || i, '{}',
                CASE WHEN i % 100 = 0 THEN 'pending' ELSE 'delivered' END, 1, now() - i * interval '1 second'
            FROM generate_series(1, 100000) AS i""",
        ),
    ]
    async with engine.connect() as conn:
        for name, _, _, _ in console_indexes():
            await conn.exec_driver_sql(f"DROP INDEX {name}")
        for step, sql in statements:
            started = time.perf_counter()
            for statement in sql.split(";\n"):
                await conn.exec_driver_sql(statement)
            steps.append((f"insert {step}", time.perf_counter() - started))
        started = time.perf_counter()
        for name, table, columns, where in console_indexes():
            partial = f" WHERE {where}" if where else ""
            await conn.exec_driver_sql(f"CREATE INDEX {name} ON {table} ({', '.join(columns)}){partial}")
        steps.append(("build migration 0017's 14 indexes", time.perf_counter() - started))
        started = time.perf_counter()
        await conn.exec_driver_sql("VACUUM ANALYZE")
        steps.append(("VACUUM ANALYZE", time.perf_counter() - started))
    return steps


async def deep_cursor(engine: AsyncEngine, sql: str) -> str:
    async with engine.connect() as conn:
        at, id_ = (await conn.execute(text(sql))).one()
    assert isinstance(at, datetime)
    return Position(at, str(id_)).encode()


async def pages(engine: AsyncEngine, grants: int, audit: int) -> list[tuple[str, str]]:
    grant_deep = await deep_cursor(
        engine,
        f"SELECT updated_at, id FROM grants ORDER BY updated_at DESC, id DESC OFFSET {grants * 9 // 10} LIMIT 1",
    )
    audit_deep = await deep_cursor(
        engine,
        f"SELECT at, id FROM audit_events ORDER BY at DESC, id DESC OFFSET {audit * 9 // 10} LIMIT 1",
    )
    async with engine.connect() as conn:
        oldest = (await conn.execute(text("SELECT min(at) FROM audit_events"))).scalar_one()
    since = (oldest.replace(microsecond=0)).strftime("%Y-%m-%dT%H:%M:%S")
    until = oldest.replace(microsecond=0, minute=(oldest.minute + 10) % 60).strftime("%Y-%m-%dT%H:%M:%S")
    return [
        ("overview", "/admin"),
        ("grants", "/admin/grants"),
        ("grants by user", "/admin/grants?user=user4242"),
        ("grants by provider", "/admin/grants?provider=slack"),
        ("grants by tenant", "/admin/grants?tenant=tenant2"),
        ("grants needing the user", "/admin/grants?status=needs_user"),
        ("grants backing off", "/admin/grants?status=failing"),
        ("grants, 90 % deep", f"/admin/grants?after={grant_deep}"),
        ("grants by provider, 90 % deep", f"/admin/grants?provider=slack&after={grant_deep}"),
        ("elicitations pending", "/admin/elicitations"),
        ("elicitations recent", "/admin/elicitations?view=recent"),
        ("audit", "/admin/audit"),
        ("audit by user", "/admin/audit?user=user4242"),
        ("audit by event", "/admin/audit?event=disconnected"),
        ("audit by provider and event", "/admin/audit?provider=slack&event=refreshed"),
        ("audit, a 10-minute window near the oldest", f"/admin/audit?since={since}&until={until}"),
        ("audit, 90 % deep", f"/admin/audit?after={audit_deep}"),
        ("audit CSV of one user (50 rows)", "/admin/audit.csv?user=user4242"),
        ("webhooks", "/admin/webhooks"),
        ("webhook deliveries", "/admin/webhooks/w3"),
        ("keys", "/admin/keys"),
    ]


async def time_pages(base_url: str, targets: Sequence[tuple[str, str]], requests: int) -> list[str]:
    rows = ["| page | first ms | median ms | p95 ms | slowest ms |", "|---|---:|---:|---:|---:|"]
    headers = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as client:
        for name, path in targets:
            times: list[float] = []
            first = 0.0
            for attempt in range(requests + 2):
                started = time.perf_counter()
                response = await client.get(path)
                elapsed = (time.perf_counter() - started) * 1000
                if response.status_code != 200:
                    raise SystemExit(f"{path}: {response.status_code} {response.text[:300]}")
                if attempt == 0:
                    first = elapsed  # the overview's and the keys page's first view counts (a cold snapshot)
                if attempt >= 2:
                    times.append(elapsed)
            rows.append(
                f"| {name} | {first:.1f} | {median(times):.1f} | {percentile(times, 95):.1f} | {max(times):.1f} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


async def run(admin_url: str, grants: int, audit: int, requests: int) -> list[str]:
    from service.app import build_runtime, build_web_app
    from service.config import load_settings
    from service.web.server import listening_socket, serving

    async with postgres_database(admin_url) as url:
        migrate(url)
        engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
        try:
            steps = await seed(engine, grants, audit)
            targets = await pages(engine, grants, audit)
        finally:
            await engine.dispose()
        port = free_port()
        env = {
            "CONNECTOR_DATABASE__URL": url,
            "CONNECTOR_VAULT__KEYS": generate_key("k1"),
            "CONNECTOR_SERVER__PORT": str(port),
            "CONNECTOR_ADMIN__ENABLED": "true",
            "CONNECTOR_ADMIN__API_KEY": OPERATOR_KEY,
            "CONNECTOR_METRICS__ENABLED": "false",
        }
        runtime = build_runtime(load_settings(None, env=env))
        try:
            with listening_socket("127.0.0.1", port) as sock:
                async with serving(build_web_app(runtime), sock):
                    rows = await time_pages(f"http://127.0.0.1:{port}", targets, requests)
        finally:
            await runtime.close()
    setup = ["| step | seconds |", "|---|---:|", *(f"| {step} | {seconds:.1f} |" for step, seconds in steps)]
    return [
        f"Measured on {machine()}: {grants:,} grants, {audit:,} audit rows, {requests} fetches per page.",
        "",
        *setup,
        "",
        *rows,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20,000 grants and 200,000 audit rows")
    parser.add_argument("--grants", type=int, default=1_000_000)
    parser.add_argument("--audit", type=int, default=10_000_000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args(argv)
    grants, audit = (20_000, 200_000) if args.quick else (args.grants, args.audit)
    admin_url = os.environ.get("BENCH_POSTGRES_URL") or os.environ.get("CONNECTOR_TEST_POSTGRES_URL")
    if not admin_url:
        print("Skipped: needs PostgreSQL (BENCH_POSTGRES_URL, e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test).")
        return
    lines: list[Any] = asyncio.run(run(admin_url, grants, audit, args.requests))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
