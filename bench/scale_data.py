"""The scale bench's database: loading it once through the real schema, and explaining what the connector sends it.

Loading: `migrate` builds the schema (every Alembic migration), then the secondary indexes of the four big tables are
dropped, the rows are made by the server (`INSERT ... SELECT ... FROM generate_series`, no row crosses the socket),
and the same indexes are built again from the definitions PostgreSQL gave before (`pg_indexes.indexdef`, two builds
at a time on two connections), then
`VACUUM ANALYZE`. The database's comment records the sizes, so `--reuse` finds it loaded. Times are relative to the
load's `now()`, so a database kept for a while only grows older (retention finds more to do, never less).

Shape: 200,000 users (`user<n>` at `https://idp.bench`), 5 providers, 4 tenants (`bench`, the API key's, and three
others), 1 % of grants needing the user; audit rows over 8 event names, the newest `audit - old` spread over the last
364 days and `old` between 366 and 730 days old (what a 365-day window purges); event-log rows over the last 6 days;
200,000 elicitations over the last 60 days (1 % open, the rest ended: those older than 30 days are retention's).

Explaining: `Captured` records each statement the store sends (with its bound parameters, as asyncpg gets them);
`explain` runs `EXPLAIN (ANALYZE, FORMAT JSON)` of one in a transaction it rolls back, with the generic plan a
prepared statement gets after its fifth run, and says how each big table was read.
"""

# ruff: noqa: S608  (the SQL here is built from integers and constants of this module, never from input)
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

BIG_TABLES = ("grants", "audit_events", "elicitation_events", "elicitations")
PROVIDERS = "ARRAY['github','google','slack','notion','linear']"
TENANTS = "ARRAY['bench','tenant1','tenant2','tenant3']"
EVENTS = "ARRAY['created','opened','verified','completed','refreshed','refresh_failed','expired','disconnected']"
USERS = 200_000
ISSUER = "https://idp.bench"
INDEXED = {"Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan"}


@dataclass(frozen=True)
class Sizes:
    grants: int
    audit: int  # audit rows in all
    old: int  # of them, past the 365-day window
    events: int
    elicitations: int

    def label(self) -> str:
        return f"bench.scale {self.grants} {self.audit} {self.old} {self.events} {self.elicitations}"


def inserts(s: Sizes) -> list[tuple[str, str]]:
    recent = s.audit - s.old
    return [
        (
            f"{s.grants:,} grants",
            f"""INSERT INTO grants (id, identity_issuer, identity_subject, provider, provider_account_id, scopes,
                token_key_id, token_ciphertext, token_expires_at, created_at, updated_at, health_status,
                health_reason, health_changed_at, last_refresh_at, tenant)
            SELECT 'g' || lpad(i::text, 12, '0'), '{ISSUER}', 'user' || (i % {USERS}),
                ({PROVIDERS})[1 + i / {USERS} % 5], 'acct' || i, '["read"]', 'k1', '\\x00'::bytea,
                now() + interval '1 hour',
                now() - i * interval '30 seconds', now() - i * interval '10 seconds',
                CASE WHEN i % 100 = 0 THEN 'needs_user' END, CASE WHEN i % 100 = 0 THEN 'revoked' END,
                CASE WHEN i % 100 = 0 THEN now() END, now() - i * interval '10 seconds',
                ({TENANTS})[1 + (i + i / {USERS}) % 4]
            FROM generate_series(1, {s.grants}) AS i""",
        ),
        (f"{recent:,} audit rows of the last year", audit_rows(recent, "now() - interval '364 days'", 364)),
        (f"{s.old:,} audit rows past the window", audit_rows(s.old, "now() - interval '730 days'", 364)),
        (
            f"{s.events:,} event-log rows",
            f"""INSERT INTO elicitation_events (elicitation_id, connection_key, status, at, origin)
            SELECT 'e' || (i % {s.elicitations}), 'v1:tenant1:conn', 'completed',
                now() - interval '6 days' + i * (interval '6 days' / {s.events}), 'bench'
            FROM generate_series(1, {s.events}) AS i""",
        ),
        (
            f"{s.elicitations:,} elicitations",
            f"""INSERT INTO elicitations (id, connection_key, identity_issuer, identity_subject, provider, scopes,
                scope_kind, agent_name, message, status, created_at, expires_at, updated_at)
            SELECT 'e' || i, 'v1:tenant1:conn', '{ISSUER}', 'user' || (i % {USERS}), ({PROVIDERS})[1 + i % 5],
                '["read"]', 'session', 'Bench agent', 'bench', CASE WHEN i % 100 = 0 THEN 'pending' ELSE
                'completed' END, now() - i * (interval '60 days' / {s.elicitations}),
                now() - i * (interval '60 days' / {s.elicitations}) + interval '10 minutes',
                now() - i * (interval '60 days' / {s.elicitations})
            FROM generate_series(1, {s.elicitations}) AS i""",
        ),
    ]


def audit_rows(n: int, start: str, days: int) -> str:
    """`n` audit rows evenly over `days` days from `start`."""
    return f"""INSERT INTO audit_events (at, event, elicitation_id, identity_issuer, identity_subject, provider, detail)
        SELECT {start} + i * (interval '{days} days' / {max(n, 1)}), ({EVENTS})[1 + i % 8], 'e' || (i % 100000),
            '{ISSUER}', 'user' || (i % {USERS}), ({PROVIDERS})[1 + i % 5], '{{"grant_id": "g1", "scopes": ["read"]}}'
        FROM generate_series(1, {n}) AS i"""


async def loaded(engine: AsyncEngine) -> str | None:
    """What the database's comment says was loaded into it (None: nothing)."""
    async with engine.connect() as conn:
        comment = await conn.exec_driver_sql(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = current_database()"
        )
        value = comment.scalar()
    return value if isinstance(value, str) else None


async def load(engine: AsyncEngine, sizes: Sizes) -> list[tuple[str, float]]:
    """The rows, then the big tables' indexes as the migrations made them; (step, seconds) of each."""
    steps: list[tuple[str, float]] = []
    async with engine.connect() as conn:
        await conn.exec_driver_sql("SET maintenance_work_mem = '256MB'")
        tables = ", ".join(f"'{t}'" for t in BIG_TABLES)
        rows = (
            await conn.exec_driver_sql(
                "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = 'public' "
                f"AND i.tablename IN ({tables}) AND NOT EXISTS (SELECT 1 FROM pg_constraint c "
                "WHERE c.conname = i.indexname)"
            )
        ).all()
        indexes: list[tuple[str, str]] = [(str(row[0]), str(row[1])) for row in rows]
        for name, _ in indexes:
            await conn.exec_driver_sql(f"DROP INDEX {name}")

    async def insert(work: list[tuple[str, str]]) -> None:
        async with engine.connect() as conn:
            for step, sql in work:
                started = time.perf_counter()
                await conn.exec_driver_sql(sql)
                steps.append((f"insert {step} (beside the other inserts)", time.perf_counter() - started))

    # The audit rows on one connection, the rest on another: two tables filled at once, one a core.
    work = inserts(sizes)
    await asyncio.gather(insert([w for w in work if "audit" in w[0]]), insert([w for w in work if "audit" not in w[0]]))
    started = time.perf_counter()
    await build_indexes(engine, [definition for _, definition in indexes])
    steps.append((f"build the big tables' {len(indexes)} secondary indexes", time.perf_counter() - started))
    async with engine.connect() as conn:
        started = time.perf_counter()
        await conn.exec_driver_sql("VACUUM ANALYZE")
        steps.append(("VACUUM ANALYZE", time.perf_counter() - started))
        await conn.exec_driver_sql(f"COMMENT ON DATABASE {conn.engine.url.database} IS '{sizes.label()}'")
    return steps


INDEX_BUILDERS = 2  # connections building indexes at once: one a core of the 2-core development machine


async def build_indexes(engine: AsyncEngine, definitions: list[str]) -> None:
    """`CREATE INDEX` each definition, `INDEX_BUILDERS` at a time (each build is one backend's sort, mostly CPU); the
    biggest tables' first, so that the builders finish together."""
    order = {table: n for n, table in enumerate(("audit_events", "elicitation_events", "grants", "elicitations"))}
    queue = sorted(definitions, key=lambda d: min((n for t, n in order.items() if f"{t} USING" in d), default=9))

    async def builder() -> None:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("SET maintenance_work_mem = '256MB'")
            while queue:
                await conn.exec_driver_sql(queue.pop(0))

    await asyncio.gather(*(builder() for _ in range(INDEX_BUILDERS)))


async def top_up_old_audit(engine: AsyncEngine, old: int) -> tuple[int, float]:
    """Make `old` audit rows past the 365-day window again (a previous run purged them), then `VACUUM (ANALYZE)` the
    table as an operator would after a bulk insert (the dead rows of the last purge go too; this server's autovacuum
    may be off): (rows added, seconds)."""
    async with engine.connect() as conn:
        have = (
            await conn.exec_driver_sql("SELECT count(*) FROM audit_events WHERE at < now() - interval '366 days'")
        ).scalar_one()
        missing = max(0, old - int(have))
        started = time.perf_counter()
        if missing:
            await conn.exec_driver_sql(audit_rows(missing, "now() - interval '730 days'", 364))
            await conn.exec_driver_sql("VACUUM (ANALYZE) audit_events")
    return missing, time.perf_counter() - started


async def checkpoint(engine: AsyncEngine) -> float:
    """`CHECKPOINT`: the load's writes go to disk now, not in a spread checkpoint during the measurements (seconds)."""
    started = time.perf_counter()
    async with engine.connect() as conn:
        await conn.exec_driver_sql("CHECKPOINT")
    return time.perf_counter() - started


async def expiry_backlog(engine: AsyncEngine) -> int:
    """Open elicitations past their expiry: what a starting sidecar's sweeper has to expire first."""
    from service.core.states import ElicitationStatus

    statuses = ", ".join(f"'{s.value}'" for s in ElicitationStatus if not s.terminal)
    async with engine.connect() as conn:
        due = await conn.exec_driver_sql(
            f"SELECT count(*) FROM elicitations WHERE status IN ({statuses}) AND expires_at < now()"
        )
        return int(due.scalar_one())


async def autovacuum_runs(engine: AsyncEngine) -> tuple[str, int]:
    """The server's `autovacuum` setting, and how many autovacuum and autoanalyze runs the big tables have had."""
    tables = ", ".join(f"'{t}'" for t in BIG_TABLES)
    async with engine.connect() as conn:
        setting = (await conn.exec_driver_sql("SHOW autovacuum")).scalar_one()
        runs = await conn.exec_driver_sql(
            "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables "
            f"WHERE relname IN ({tables})"
        )
        return str(setting), int(runs.scalar_one())


@dataclass
class Captured:
    """The statements the store sent while capturing (SQL with $n placeholders, and the parameters)."""

    statements: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
            self.statements.append((statement, tuple(parameters or ())))

        event.listen(Engine, "before_cursor_execute", record)
        try:
            yield
        finally:
            event.remove(Engine, "before_cursor_execute", record)


def dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def walk(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from walk(child)


@dataclass(frozen=True)
class Plan:
    sql: str
    scans: list[str]  # "<node> on <table> [using <index>]" for each big table read
    rows_read: int  # rows the big tables' scans returned or filtered out
    ms: float

    @property
    def indexed(self) -> bool:
        return all(scan.split(" on ")[0] in INDEXED for scan in self.scans)


async def explain(url: str, sql: str, params: tuple[Any, ...], *, generic: bool = True) -> Plan:
    conn = await asyncpg.connect(dsn(url))
    try:
        await conn.execute(f"SET plan_cache_mode = {'force_generic_plan' if generic else 'auto'}")
        async with conn.transaction():
            document = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *params)
            raise _Rollback  # EXPLAIN ANALYZE ran the statement: undo what it wrote
    except _Rollback:
        pass
    finally:
        await conn.close()
    top = json.loads(document)[0]
    scans, read = [], 0
    for node in walk(top["Plan"]):
        table = node.get("Relation Name")
        if table in BIG_TABLES and node["Node Type"] != "ModifyTable":
            using = f" using {node['Index Name']}" if "Index Name" in node else ""
            scans.append(f"{node['Node Type']} on {table}{using}")
            loops = node.get("Actual Loops", 1)
            read += (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
    return Plan(" ".join(sql.split())[:160], scans, read, float(top.get("Execution Time", 0.0)))


class _Rollback(Exception):
    pass
