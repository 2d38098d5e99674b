"""At scale on PostgreSQL: 1,000,000 grants and 10,000,000 audit and event-log rows, each goal met or not met.

    BENCH_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python -m bench.scale [--quick] [--reuse] [--database scale] [--calls 1000] [--quiet-seconds 20]

`make bench` runs it when BENCH_POSTGRES_URL is set and BENCH_ARGS holds `--scale` (about 5-8 minutes on the 2-core
development machine at load average 6-9, 3-4 of them the load: the inserts and the index builds run two at a time,
one a core; it prints its own run time against the goal of 15 minutes). After the load it does what an operator does
after a bulk load: `VACUUM ANALYZE` (and `VACUUM (ANALYZE) audit_events` after a `--reuse` run's top-up), then a
`CHECKPOINT`, so that nothing measured shares the server with the load's writes. The database
`--database` (default `scale`) is created on the server of BENCH_POSTGRES_URL (or CONNECTOR_TEST_POSTGRES_URL) and
loaded once (`bench/scale_data.py`: 1,000,000 grants of 200,000 users, 8,000,000 audit rows of which 1,000,000 are past
the 365-day window, 2,000,000 event-log rows, 200,000 elicitations). Without `--reuse` it is dropped at the end; with
it, it is kept, and a later `--reuse` run skips the load (it only makes 1,000,000 audit rows old again, since the
previous run purged them). A second database, `<database>_empty`, migrated and holding only the bench's API key and
grant, is the empty baseline; it is always dropped. `--quick`: 20,000 grants, 200,000 audit rows (20,000 old), 50,000
events, 20,000 elicitations.

Three processes on loopback besides this one: a provider API (`bench/proxy.py --upstream`) and two sidecars
(`acp-connector serve`), one on the loaded database and one on the empty one (their own retention is off: this
process applies it). Measured, in order:
1. Plans: every statement of a user's `GET /v1/grants` (one grant lookup per provider), of the sweeper's pass
   (expiring due elicitations), of the replicas' event-log feed, and of a retention pass with nothing left to
   delete, captured as the store sends them and explained (`EXPLAIN ANALYZE`, generic plan, rolled back): the goal
   is no sequential scan of a big table, and a retention pass that reads no row.
2. Token use: small proxied GETs (`/v1/proxy/bench/small`) and `GET /v1/grants` of one user, on the loaded and the
   empty sidecar, interleaved in blocks of 50: p99 loaded / empty, goal <= 1.2x for the proxy. Measured once the
   loaded sidecar's sweeper has expired the 2,000 elicitations the load leaves open past their expiry (its first
   passes, 5 s after it starts: timed beside them, the proxied calls of that process were the tail, 2.1-2.4x); the
   server's autovacuum setting and the autovacuum and autoanalyze runs on the big tables meanwhile are printed.
3. Retention beside flows: four loops of a `/v1` flow (create an elicitation for a new user, cancel it: an
   elicitation, its audit rows and its event in three transactions) against the loaded sidecar, quiet for
   `--quiet-seconds`, then while a child process purges the 1,000,000 old audit rows (the default policy: batches
   of at most 500 rows sized by their measured time, each followed by a rest as long; each batch one transaction,
   timed by the child), then quiet again. Goals: flow p99 during the purge <= 1.5x the quiet runs' p99; no batch
   over 100 ms (the batches over it are named: kind, rows, time).

2b. The same user's calls through the embedded `connector.http()` (`bench/scale_embedded.py`), a connector on each
   database in this process: p99 loaded / empty, goal <= 1.2x.

Not measured here (issue 32's other scale items): 100,000 awaited elicitations across four processes
(`bench/pending.py`); LISTEN/NOTIFY fan-out per replica at 1, 2, 4 and 8 replicas (`bench/fanout.py`); the
cross-replica completion and its slowest flows (`bench/replicas.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from bench.harness import REPO, connector_env, free_port, machine, percentile, wait_until_up
from bench.proxy import TOKEN, latencies
from bench.scale_data import (
    ISSUER,
    Captured,
    Plan,
    Sizes,
    autovacuum_runs,
    checkpoint,
    expiry_backlog,
    explain,
    load,
    loaded,
    top_up_old_audit,
)
from bench.scale_embedded import embedded_token_use
from service import Identity
from service.core.retention import PurgeKind, RetentionPolicy, purge_due
from service.util.heap import freeze_startup_objects

FULL = Sizes(grants=1_000_000, audit=8_000_000, old=1_000_000, events=2_000_000, elicitations=200_000)
QUICK = Sizes(grants=20_000, audit=200_000, old=20_000, events=50_000, elicitations=20_000)
USER = "user4242"  # one of the loaded users (5 grants), given a grant at the bench API too
FLOWS = 4


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


@contextlib.asynccontextmanager
async def database(admin: AsyncEngine, name: str, *, keep: bool) -> AsyncIterator[None]:
    async with admin.connect() as conn:
        exists = await conn.exec_driver_sql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'")  # noqa: S608
        if exists.scalar() is None:
            await conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield
    finally:
        if not keep:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def seed_bench_user(url: str, api: tuple[str, Any], vault_key: str) -> None:
    """The API key (the same one in both databases) and USER's grant at the bench API, as the sidecar stores them."""
    from service import Identity
    from service.core.handles import grant_aad, new_id
    from service.core.records import GrantRecord, TokenSet
    from service.store import Store
    from service.vault import Vault, load_key_ring

    store = Store.from_url(url)
    try:
        await store.api_keys.insert(api[1])
        user = Identity(ISSUER, USER)
        ring = load_key_ring([vault_key], None, None)
        assert ring is not None
        tokens = TokenSet(TOKEN, "Bearer", None, None, ("read",))
        key_id, blob = Vault(ring).encrypt_json(tokens.to_json(), aad=grant_aad(ISSUER, USER, "bench", "1"))
        now = datetime.now(UTC)
        grant = GrantRecord(new_id(16), user, "bench", "1", ("read",), key_id, blob, None, now, now, tenant="bench")
        await store.grants.upsert(grant)
    finally:
        await store.close()


@dataclass
class Sidecars:
    api_key: str
    bases: dict[str, str]  # "loaded" / "empty" -> http://127.0.0.1:port
    vault_key: str
    catalog: Path


@contextlib.asynccontextmanager
async def sidecars(urls: dict[str, str], workdir: Path) -> AsyncIterator[Sidecars]:
    from service.core.agent_api import new_api_key
    from service.vault import generate_key

    vault_key = generate_key("k1")
    api = new_api_key("bench", "Bench", None, datetime.now(UTC))
    for url in urls.values():
        await seed_bench_user(url, api, vault_key)
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    catalog = workdir / "providers.toml"
    catalog.write_text(
        f'[bench]\ndisplay_name = "Bench API"\nauthorization_endpoint = "{upstream}/authorize"\n'
        f'token_endpoint = "{upstream}/token"\napi_base_url = "{upstream}/api"\n'
    )
    log = (workdir / "processes.log").open("wb")
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable, str(REPO / "bench" / "proxy.py"), "--upstream", str(up_port), stdout=log, stderr=log
        )
    ]
    bases = {}
    for name, url in urls.items():
        port = free_port()
        env = {
            **connector_env(port, url, vault_key, catalog),
            "CONNECTOR_PROVIDER_BENCH_CLIENT_ID": "bench",
            "CONNECTOR_PROVIDER_BENCH_CLIENT_SECRET": "bench-secret",
            "CONNECTOR_LOG_FORMAT": "json",
            **{f"CONNECTOR_RETENTION__{kind}_DAYS": "0" for kind in ("ELICITATION", "VERIFICATION", "AUDIT")},
            **{f"CONNECTOR_RETENTION__{kind}_DAYS": "0" for kind in ("EVENT", "WEBHOOK_DELIVERY")},
        }
        processes.append(
            await asyncio.create_subprocess_exec(
                sys.executable, "-m", "service.cli", "serve", env=env, cwd=REPO, stdout=log, stderr=log
            )
        )
        bases[name] = f"http://127.0.0.1:{port}"
    try:
        await wait_until_up(f"{upstream}/api/small", within=60)
        for base in bases.values():
            await wait_until_up(f"{base}/healthz", within=120)
        yield Sidecars(api[0], bases, vault_key, catalog)
    finally:
        for process in processes:
            process.terminate()
            await process.wait()
        log.close()


def retention_batches(engine: AsyncEngine) -> Captured:
    """One batch of each kind, as the store would send it now (explained, not run: the rows are still there)."""
    from service.store.retention import purge_batch

    captured = Captured()
    now = datetime.now(UTC)
    for kind, window in RetentionPolicy().windows().items():
        statement = purge_batch(kind, now - window, limit=RetentionPolicy().batch_size, dialect="postgresql")
        compiled = statement.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
        captured.statements.append((str(compiled), tuple(compiled.params[n] for n in compiled.positiontup or ())))
    return captured


async def plans(url: str, *, idle_pass: bool) -> tuple[list[str], bool]:
    """Each statement of a grants listing, a sweep and the feed, explained; and of a retention pass run now
    (`idle_pass`: after the purge, so it has nothing to delete), else of one batch of each kind, not run."""
    from service import Identity
    from service.store import Store

    store = Store.from_url(url)
    groups: dict[str, Captured] = {name: Captured() for name in ("GET /v1/grants", "sweeper", "feed")}
    groups["retention"] = Captured() if idle_pass else retention_batches(store.engine)
    try:
        with groups["GET /v1/grants"].capturing():
            for provider in ("github", "google", "slack", "notion", "linear", "bench"):
                await store.grants.find(Identity(ISSUER, USER), provider, tenants=["bench"])
        with groups["sweeper"].capturing():
            await store.elicitations.expire_due(datetime.now(UTC), limit=200)
        with groups["feed"].capturing():
            last = await store.outbox.last_id()
            await store.outbox.after(last - 100)
        if idle_pass:
            with groups["retention"].capturing():
                await purge_due(store.retention, RetentionPolicy(), datetime.now(UTC))
    finally:
        await store.close()
    lines = ["| what | statement | big tables read by | rows read | ms |", "|---|---|---|---:|---:|"]
    ok = True
    for name, captured in groups.items():
        seen: set[str] = set()
        for sql, params in captured.statements:
            if sql in seen or sql.lstrip().upper().startswith(("BEGIN", "COMMIT", "SET", "SHOW")):
                continue
            seen.add(sql)
            plan: Plan = await explain(url, sql, params)
            # A batch reads at most what it deletes; a pass with nothing to delete reads nothing.
            bound = 0 if idle_pass else 2 * RetentionPolicy().batch_size
            ok = ok and plan.indexed and (name != "retention" or plan.rows_read <= bound)
            scans = "; ".join(plan.scans) or "(none)"
            lines.append(f"| {name} | `{plan.sql}` | {scans} | {plan.rows_read} | {plan.ms:.1f} |")
    return lines, ok


async def token_use(side: Sidecars, calls: int) -> tuple[list[str], bool]:
    user_headers = {"Connector-User-Issuer": ISSUER, "Connector-User-Subject": USER}
    headers = {"Authorization": f"Bearer {side.api_key}", **user_headers}
    query = f"?issuer={ISSUER}&subject={USER}"
    routes = {
        **{f"proxy, {name}": (f"{base}/v1/proxy/bench/small", headers) for name, base in side.bases.items()},
        **{f"grants, {name}": (f"{base}/v1/grants{query}", headers) for name, base in side.bases.items()},
    }
    async with httpx.AsyncClient(timeout=60) as client:
        measured = await latencies(client, routes, calls, {})
    p = {name: (percentile(samples, 50), percentile(samples, 99)) for name, (samples, _) in measured.items()}
    ratio = p["proxy, loaded"][1] / p["proxy, empty"][1]
    grants_ratio = p["grants, loaded"][1] / p["grants, empty"][1]
    lines = [
        f"{calls} calls per route, interleaved in blocks of 50, sequential (ms):",
        "",
        "| route | p50 | p99 |",
        "|---|---:|---:|",
        *(f"| {name} | {p50:.2f} | {p99:.2f} |" for name, (p50, p99) in p.items()),
        "",
        f"- proxied call p99, loaded / empty: {ratio:.2f}x (goal <= 1.2x): {verdict(ratio <= 1.2)}",
        f"- `GET /v1/grants` of one user p99, loaded / empty: {grants_ratio:.2f}x ({p['grants, loaded'][1]:.1f} ms)",
    ]
    return lines, ratio <= 1.2


async def stats(url: str, read: Any) -> Any:
    """`read(engine)` on a connection of its own to `url`."""
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        return await read(engine)
    finally:
        await engine.dispose()


async def backlog_worked_off(url: str, within: float = 300.0) -> tuple[int, float]:
    """Wait until the loaded sidecar's sweeper has expired the elicitations the load left open past their expiry (its
    first pass, 2,000 in batches of 50 with their audit rows, log rows and events: token use timed beside them
    times the sweeper's work in the same process); (how many were due, seconds waited)."""
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        started = time.perf_counter()
        due = first = await expiry_backlog(engine)
        while due:
            if time.perf_counter() - started > within:
                raise RuntimeError(f"{due} elicitations still due for expiry after {within:.0f} s")
            await asyncio.sleep(0.5)
            due = await expiry_backlog(engine)
        await asyncio.sleep(1)  # the last batch's events are published after its commit
        return first, time.perf_counter() - started
    finally:
        await engine.dispose()


class TimedRetention:
    """The store's retention, each batch (one transaction) timed from here."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[float] = []
        self.sizes: list[int] = []  # each batch's limit, as retention's batch sizer chose it
        self.slow: list[str] = []  # the batches over 100 ms
        self.full_collections: list[tuple[int, float]] = []  # the batch each ran in, and its ms
        self._collecting_since = 0.0

    def on_collection(self, phase: str, info: dict[str, int]) -> None:
        """`gc.callbacks`: each full collection of the purging process, with the batch it stalled."""
        if phase == "start":
            self._collecting_since = time.perf_counter()
        elif info["generation"] == 2:
            took = (time.perf_counter() - self._collecting_since) * 1000
            self.full_collections.append((len(self.batches) + 1, round(took, 1)))

    async def count(self, kind: PurgeKind, before: datetime) -> int:
        return int(await self.inner.count(kind, before))

    async def purge(self, kind: PurgeKind, before: datetime, *, limit: int) -> int:
        started = time.perf_counter()
        removed = int(await self.inner.purge(kind, before, limit=limit))
        took = (time.perf_counter() - started) * 1000
        self.batches.append(took)
        self.sizes.append(limit)
        if took > 100:
            self.slow.append(f"{kind.value} {limit} rows {took:.0f} ms (batch {len(self.batches)})")
        return removed


async def flow_loops(base: str, api_key: str, stop: asyncio.Event, into: list[float]) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}

    async def loop(n: int) -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:
            while not stop.is_set():
                started = time.perf_counter()
                body = {
                    "user": {"issuer": ISSUER, "subject": f"flow-{n}-{uuid.uuid4().hex[:12]}"},
                    "provider": "bench",
                    "scopes": ["read"],
                    "scope": {"sessionId": f"s{n}", "toolCallId": "c1"},
                }
                created = await client.post("/v1/elicitations", json=body)
                created.raise_for_status()
                eid = created.json()["elicitationId"]
                (await client.post(f"/v1/elicitations/{eid}/cancel", json={})).raise_for_status()
                into.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(loop(n) for n in range(FLOWS)))


async def flows_while(base: str, api_key: str, work: Any) -> list[float]:
    """Flow times (ms) of FLOWS loops while `work` (a coroutine) runs."""
    stop, times = asyncio.Event(), list[float]()
    loops = asyncio.create_task(flow_loops(base, api_key, stop, times))
    try:
        await work
    finally:
        stop.set()
        await loops
    return times


async def purge_here(url: str) -> dict[str, Any]:
    """`--purge URL` (a child process, so that the flow loops' event loop does not delay the batches' timing): the
    default policy applied until nothing is left, each batch timed, then a pass with nothing to delete."""
    from service.store import Store

    store = Store.from_url(url)
    try:
        await store.ping()  # the connection is made before the first batch is timed
        # As `acp-connector serve` does once it listens: unfrozen, a full collection of this process's ~130,000
        # start objects stalls it ~100 ms, with the batch's transaction open (seen: batch 2097, 103 ms).
        freeze_startup_objects()
        timed = TimedRetention(store.retention)
        gc.callbacks.append(timed.on_collection)
        started = time.perf_counter()
        deleted = await purge_due(timed, RetentionPolicy(), datetime.now(UTC))
        took = time.perf_counter() - started
        idle = TimedRetention(store.retention)
        started = time.perf_counter()
        await purge_due(idle, RetentionPolicy(), datetime.now(UTC))
        idle_ms = (time.perf_counter() - started) * 1000
    finally:
        await store.close()
    return {
        "deleted": dict(deleted),
        "batches": timed.batches,
        "sizes": timed.sizes,
        "slow": timed.slow,
        "full_collections": timed.full_collections,
        "took": took,
        "idle": idle.batches,
        "idle_ms": idle_ms,
    }


async def purge_in_child(url: str) -> dict[str, Any]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.scale", "--purge", url, cwd=REPO, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the purge failed (exit {child.returncode})")
    result: dict[str, Any] = json.loads(out)
    return result


async def retention_beside_flows(url: str, side: Sidecars, quiet: float) -> tuple[list[str], bool]:
    base = side.bases["loaded"]
    await flows_while(base, side.api_key, asyncio.sleep(3))  # warm-up
    before = await flows_while(base, side.api_key, asyncio.sleep(quiet))
    done: dict[str, Any] = {}

    async def purge() -> None:
        done.update(await purge_in_child(url))

    during = await flows_while(base, side.api_key, purge())
    after = await flows_while(base, side.api_key, asyncio.sleep(quiet))
    batches: list[float] = done["batches"]
    sizes: list[int] = done["sizes"]
    quiet_p99 = percentile(before + after, 99)
    ratio = percentile(during, 99) / quiet_p99
    over = sum(1 for ms in batches if ms > 100)
    deleted: dict[str, int] = done["deleted"]
    lines = [
        f"- purged {sum(deleted.values()):,} rows ({', '.join(f'{k}: {n:,}' for k, n in deleted.items() if n)}) "
        f"in {len(batches)} batches, {done['took']:.1f} s, beside {FLOWS} flow loops",
        f"- batch (one transaction, timed by the purging process) ms: p50 {percentile(batches, 50):.1f}, p99 "
        f"{percentile(batches, 99):.1f}, longest {max(batches):.1f}; {over} over 100 ms (goal: none): "
        f"{verdict(over == 0)}",
        f"- batch size (rows, chosen from the last batch's time, target "
        f"{RetentionPolicy().batch_target_seconds * 1000:.0f} ms, at most {RetentionPolicy().batch_size}): p50 "
        f"{percentile(sizes, 50):.0f}, min {min(sizes)}, max {max(sizes)}; a rest as long as each batch after it",
        *([f"- the batches over 100 ms: {'; '.join(done['slow'])}"] if done["slow"] else []),
        "- full garbage collections of the purging process (its start's objects frozen, as `serve` freezes them): "
        + (", ".join(f"{ms} ms in batch {n}" for n, ms in done["full_collections"]) or "none"),
        f"- flow (create + cancel over `/v1`) p99: quiet {quiet_p99:.1f} ms ({len(before) + len(after)} flows), "
        f"during the purge {percentile(during, 99):.1f} ms ({len(during)} flows): {ratio:.2f}x (goal <= 1.5x): "
        f"{verdict(ratio <= 1.5)}",
        f"- then a retention pass with nothing left to delete: {done['idle_ms']:.1f} ms, {len(done['idle'])} "
        f"statements, longest {max(done['idle']):.1f} ms",
    ]
    return lines, over == 0 and ratio <= 1.5


async def run(admin_url: str, name: str, sizes: Sizes, *, reuse: bool, calls: int, quiet: float) -> list[str]:
    from service.store import migrate

    began = time.perf_counter()
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    empty_url = make_url(admin_url).set(database=f"{name}_empty").render_as_string(hide_password=False)
    out = [f"Measured on {machine()}."]
    try:
        async with database(admin, name, keep=reuse), database(admin, f"{name}_empty", keep=False):
            engine = create_async_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
            try:
                was = await loaded(engine)
                if was != sizes.label() or not reuse:
                    if was is not None:  # loaded with other sizes (or a previous run's leftovers): start over
                        await engine.dispose()
                        async with admin.connect() as conn:
                            await conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
                            await conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
                    started = time.perf_counter()
                    migrate(url)
                    steps = [("migrate (every revision, empty tables)", time.perf_counter() - started)]
                    steps += await load(engine, sizes)
                else:
                    migrate(url)
                    steps = [("reused the loaded database", 0.0)]
                added, seconds = await top_up_old_audit(engine, sizes.old)
                steps.append((f"make {added:,} audit rows old again (then VACUUM (ANALYZE) audit_events)", seconds))
                steps.append(
                    ("CHECKPOINT (the load's writes on disk before anything is measured)", await checkpoint(engine))
                )
            finally:
                await engine.dispose()
            migrate(empty_url)
            out += ["", "| load step | seconds |", "|---|---:|", *(f"| {s} | {t:.1f} |" for s, t in steps), ""]
            total = sum(t for _, t in steps)
            out.append(
                f"Loaded in {total:.0f} s: {sizes.grants:,} grants, {sizes.audit + sizes.events:,} audit and "
                f"event-log rows ({sizes.old:,} audit rows past the 365-day window)."
            )
            with tempfile.TemporaryDirectory() as tmp:
                async with sidecars({"loaded": url, "empty": empty_url}, Path(tmp)) as side:
                    plan_lines, plans_ok = await plans(url, idle_pass=False)
                    due, waited = await backlog_worked_off(url)
                    setting, runs_before = await stats(url, autovacuum_runs)
                    use_lines, _ = await token_use(side, calls)
                    embedded_lines, _ = await embedded_token_use(
                        {"loaded": url, "empty": empty_url}, side.vault_key, side.catalog, Identity(ISSUER, USER), calls
                    )
                    runs_after = (await stats(url, autovacuum_runs))[1]
                    purge_lines, _ = await retention_beside_flows(url, side, quiet)
                    idle_lines, idle_ok = await plans(url, idle_pass=True)  # retention with nothing to delete
            out += [
                "",
                "Token use on the loaded database against the empty one (measured once the loaded sidecar's sweeper "
                f"had expired the {due:,} elicitations the load left open past their expiry: {waited:.1f} s; "
                f"autovacuum is {setting} on this server, {runs_after - runs_before} autovacuum or autoanalyze runs "
                "on the big tables while token use was measured):",
                "",
                *use_lines,
            ]
            out += ["", *embedded_lines]
            out += ["", "Retention beside flows:", "", *purge_lines]
            out += [
                "",
                "Plans before the purge (generic plans, `EXPLAIN ANALYZE`, rolled back; retention: one batch of",
            ]
            out += ["each kind, 1,000,000 old audit rows there):", "", *plan_lines]
            out += ["", "After the purge (retention: a whole pass, nothing left to delete):", "", *idle_lines]
            out += [
                "",
                f"- every statement above reads big tables by an index only, and the retention pass with "
                f"nothing left to delete reads no row: {verdict(plans_ok and idle_ok)}",
            ]
    finally:
        await admin.dispose()
    kept = f"kept (`--reuse`): database `{name}`" if reuse else f"dropped: database `{name}`"
    out.append(f"- {kept}; `{name}_empty` dropped")
    minutes = (time.perf_counter() - began) / 60
    load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    out.append(
        f"- the whole bench: {minutes:.1f} minutes (goal < 15 on the 2-core machine): {verdict(minutes < 15)}; "
        f"load average at the end {load_average}"
    )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small database (a smoke run)")
    parser.add_argument("--reuse", action="store_true", help="keep the loaded database, and use it if loaded")
    parser.add_argument("--database", default="scale", help="the bench database's name (default: scale)")
    parser.add_argument("--calls", type=int, default=1000, help="calls per route for token use")
    parser.add_argument("--quiet-seconds", type=float, default=20.0, help="each quiet run of the flow loops")
    parser.add_argument("--purge", metavar="URL", help=argparse.SUPPRESS)  # the purging child process
    args = parser.parse_args(argv)
    if args.purge:
        print(json.dumps(asyncio.run(purge_here(args.purge))))
        return
    admin_url = os.environ.get("BENCH_POSTGRES_URL") or os.environ.get("CONNECTOR_TEST_POSTGRES_URL")
    if not admin_url:
        print("Skipped: needs PostgreSQL (BENCH_POSTGRES_URL, e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test).")
        return
    sizes = QUICK if args.quick else FULL
    calls = min(args.calls, 300) if args.quick else args.calls
    quiet = min(args.quiet_seconds, 5.0) if args.quick else args.quiet_seconds
    lines = asyncio.run(run(admin_url, args.database, sizes, reuse=args.reuse, calls=calls, quiet=quiet))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
