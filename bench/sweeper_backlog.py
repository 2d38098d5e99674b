"""What a backlog of expiries does to the requests of the process whose sweeper works it off.

A backlog of due elicitations (after a restart, a bulk load, an outage of the sweeper) is expired by the sweeper of
one process, batch after batch. This bench measures what the requests of that process see meanwhile, against a
quiet period of the same run, and how fast the backlog clears:

  1. a provider API (`bench/proxy.py --upstream`) and a sidecar (`acp-connector serve`, sweep interval 1 s) on
     loopback, on a fresh database (SQLite file, or a PostgreSQL database of its own, dropped afterwards);
  2. N open elicitations written straight to the database, due `--quiet` seconds later;
  3. meanwhile, sequential small GETs through the sidecar's token proxy (`/v1/proxy/bench/small`), each timed,
     and a probe of a write another process makes: every 20 ms one short write transaction (SQLite: `BEGIN
     IMMEDIATE` and an update of a table of its own, waiting on `busy_timeout` as a flow does; PostgreSQL: the event
     log's order lock, which every flow's ending takes), each timed;
  4. the requests and probes that started before the elicitations were due are the quiet period; those that started
     between the first and the last expiry (the audit rows' times) are the backlog's.

It checks that every elicitation was expired exactly once, with one `expired` audit row and one event-log row each.
Reported per route: proxy GET p50 / p99 / max, quiet and during the backlog; the probe's max; the clearing time
(first to last expiry) and expiries per second.

`--compare-with CHECKOUT` runs another checkout's sidecar (a worktree of main: "before") as well, alternating with
this one's round by round on the same machine state.

`--breakdown 25,50,200` measures instead where a batch's time goes, in this process (this checkout only): for each
batch size, the backlog expired batch after batch with `Elicitations.expire_due` (no rests), the event loop's
longest stall meanwhile (how late a task sleeping 1 ms at a time wakes), and each batch's time in its statements
(the UPDATE, the audit insert, the event-log append), its audit lines and its events published.

    .venv/bin/python -m bench.sweeper_backlog [--backlog 2000] [--rounds 2] [--databases sqlite,postgres]
        [--compare-with CHECKOUT] [--quiet 4] [--breakdown 25,50,200]

PostgreSQL needs BENCH_POSTGRES_URL or CONNECTOR_TEST_POSTGRES_URL (an admin URL; the bench creates and drops one
small database per round, the sidecar keeps at most 6 connections).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.harness import connector_env, free_port, machine, median, percentile, postgres_database, wait_until_up
from bench.proxy import seed

ROOT = Path(__file__).resolve().parent.parent
PROBE_EVERY = 0.02  # seconds between two probe writes


@dataclass
class Round:
    route: str
    database: str
    number: int
    requests: list[tuple[float, float]] = field(default_factory=list)  # (start, ms)
    probes: list[tuple[float, float]] = field(default_factory=list)
    due_at: float = 0.0
    first: float = 0.0
    last: float = 0.0
    expired: int = 0
    problems: list[str] = field(default_factory=list)


def _elicitation_rows(n: int, due: datetime) -> list[dict[str, object]]:
    from service.core.handles import new_id
    from service.core.identity import Identity
    from service.core.records import ElicitationRecord
    from service.core.states import ElicitationStatus
    from service.store.elicitation_rows import to_row

    created = due - timedelta(minutes=10)
    return [
        to_row(
            ElicitationRecord(
                new_id(16),
                "v1:bench:backlog",
                Identity("https://login.example.com", f"backlog-{i}"),
                "bench",
                ("read",),
                "request",
                "session",
                "tool-call",
                i,
                "bench agent",
                "Connect the bench API",
                ElicitationStatus.PENDING,
                None,
                created,
                due,
                created,
            )
        )
        for i in range(n)
    ]


@contextlib.asynccontextmanager
async def database(kind: str, tmp: Path, index: int) -> AsyncIterator[str]:
    """A fresh database: a SQLite file in `tmp`, or a PostgreSQL database of its own (dropped afterwards)."""
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp}/backlog-{index}.db"
        return
    admin_url = os.environ.get("BENCH_POSTGRES_URL") or os.environ.get("CONNECTOR_TEST_POSTGRES_URL")
    if not admin_url:
        raise SystemExit("PostgreSQL: set BENCH_POSTGRES_URL or CONNECTOR_TEST_POSTGRES_URL")
    async with postgres_database(admin_url, prefix="bench_sweeper") as url:
        yield url


def _sqlite_probe(path: str, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Another process's write on SQLite: `BEGIN IMMEDIATE` waits on busy_timeout for the one writer, as a flow's."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_probe (id INTEGER PRIMARY KEY, n INTEGER)")
    conn.execute("INSERT OR IGNORE INTO bench_probe VALUES (1, 0)")
    while not stop.is_set():
        start = time.time()
        began = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE bench_probe SET n = n + 1 WHERE id = 1")
        conn.execute("COMMIT")
        out.append((start, (time.perf_counter() - began) * 1000))
        stop.wait(PROBE_EVERY)
    conn.close()


async def _postgres_probe(url: str, stop: asyncio.Event, out: list[tuple[float, float]]) -> None:
    """Another process's write on PostgreSQL: the event log's order lock, which every flow's ending takes."""
    from service.store.outbox import ORDER_LOCK_KEY

    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            while not stop.is_set():
                start = time.time()
                began = time.perf_counter()
                async with conn.begin():
                    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ORDER_LOCK_KEY})
                out.append((start, (time.perf_counter() - began) * 1000))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), PROBE_EVERY)
    finally:
        await engine.dispose()


async def one_round(
    route: str, number: int, checkout: Path, kind: str, index: int, backlog: int, quiet: float, upstream: str, tmp: Path
) -> Round:
    from service.store import Store
    from service.store.tables import audit_events, elicitation_events, elicitations
    from service.vault import generate_key

    result = Round(route, kind, number)
    async with database(kind, tmp, index) as url:
        vault_key = generate_key("k1")
        api_key = await seed(url, vault_key)
        port = free_port()
        env = {
            **connector_env(port, url, vault_key, tmp / "providers.toml"),
            "CONNECTOR_PROVIDER_BENCH_CLIENT_ID": "bench",
            "CONNECTOR_PROVIDER_BENCH_CLIENT_SECRET": "bench-secret",
            "CONNECTOR_LOG_FORMAT": "json",
            "CONNECTOR_ELICITATION__SWEEP_INTERVAL_SECONDS": "1",
            "CONNECTOR_DATABASE__POOL_SIZE": "4",
            "CONNECTOR_DATABASE__MAX_OVERFLOW": "2",
        }
        log = open(tmp / f"sidecar-{index}.log", "wb")  # noqa: ASYNC230 - closed below
        sidecar = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "service.cli", "serve", env=env, cwd=checkout, stdout=log, stderr=log
        )
        store = Store.from_url(url)
        try:
            await wait_until_up(f"http://127.0.0.1:{port}/healthz", within=60)
            proxied = f"http://127.0.0.1:{port}/v1/proxy/bench/small"
            headers = {
                "Authorization": f"Bearer {api_key}",
                "Connector-User-Issuer": "https://login.example.com",
                "Connector-User-Subject": "bench-user",
            }
            async with httpx.AsyncClient(timeout=30) as client:
                for _ in range(100):  # warm-up: connections, the grant's cache
                    (await client.get(proxied, headers=headers)).raise_for_status()
                due = datetime.now(UTC) + timedelta(seconds=quiet + 1.0)
                async with store.transaction() as tx:
                    await tx.execute(insert(elicitations), _elicitation_rows(backlog, due))
                result.due_at = due.timestamp()
                stop_probe = threading.Event()
                stop_pg = asyncio.Event()
                if kind == "sqlite":
                    probe: threading.Thread | asyncio.Task[None] = threading.Thread(
                        target=_sqlite_probe, args=(make_url(url).database, stop_probe, result.probes)
                    )
                    probe.start()
                else:
                    probe = asyncio.create_task(_postgres_probe(url, stop_pg, result.probes))
                expired_rows = (
                    select(func.count(), func.min(audit_events.c.at), func.max(audit_events.c.at))
                    .where(audit_events.c.event == "expired")
                    .select_from(audit_events)
                )
                deadline = time.time() + quiet + 1.0 + 120
                next_check = time.time() + quiet + 1.0
                try:
                    while time.time() < deadline:
                        start = time.time()
                        began = time.perf_counter()
                        response = await client.get(proxied, headers=headers)
                        result.requests.append((start, (time.perf_counter() - began) * 1000))
                        response.raise_for_status()
                        if start >= next_check:
                            async with store.db.reader.connect() as conn:
                                count, _, _ = (await conn.execute(expired_rows)).one()
                            if count >= backlog:
                                break
                            next_check = start + 0.5
                    for _ in range(100):  # a quiet second after it
                        start = time.time()
                        began = time.perf_counter()
                        (await client.get(proxied, headers=headers)).raise_for_status()
                        result.requests.append((start, (time.perf_counter() - began) * 1000))
                finally:
                    stop_probe.set()
                    stop_pg.set()
                    if isinstance(probe, threading.Thread):
                        await asyncio.to_thread(probe.join)
                    else:
                        await probe
            async with store.db.reader.connect() as conn:
                count, first, last = (await conn.execute(expired_rows)).one()
                distinct = (
                    await conn.execute(
                        select(func.count(func.distinct(audit_events.c.elicitation_id))).where(
                            audit_events.c.event == "expired"
                        )
                    )
                ).scalar_one()
                logged = (
                    await conn.execute(
                        select(func.count(), func.count(func.distinct(elicitation_events.c.elicitation_id))).where(
                            elicitation_events.c.status == "expired"
                        )
                    )
                ).one()
                still_open = (
                    await conn.execute(
                        select(func.count()).select_from(elicitations).where(elicitations.c.status != "expired")
                    )
                ).scalar_one()
            result.expired = count
            if first is not None:
                # From the first batch's start (its rows' time) to the last one's audit lines, logged after its commit.
                result.first = first.timestamp()
                result.last = max(last.timestamp(), _last_expiry_logged(tmp / f"sidecar-{index}.log"))
            if not (count == distinct == backlog and tuple(logged) == (backlog, backlog) and still_open == 0):
                result.problems.append(
                    f"expired audit rows {count} ({distinct} distinct), event rows {tuple(logged)}, "
                    f"not expired {still_open} of {backlog}"
                )
        finally:
            await store.close()
            sidecar.terminate()
            await sidecar.wait()
            log.close()
    return result


def _last_expiry_logged(path: Path) -> float:
    last = 0.0
    for line in path.read_text().splitlines():
        if '"audit_event": "expired"' in line:
            last = max(last, datetime.fromisoformat(json.loads(line)["time"].replace("Z", "+00:00")).timestamp())
    return last


def _figures(samples: list[tuple[float, float]], lo: float, hi: float) -> list[float]:
    return [ms for start, ms in samples if lo <= start <= hi]


def _line(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{median(values):.2f} / {percentile(values, 99):.2f} / {max(values):.1f}"


def report(rounds: list[Round], backlog: int) -> None:
    print(
        "| database | route | round | proxy GET p50 / p99 / max, quiet (ms) | during the backlog (ms) | calls "
        "during | probe write p99 / max, quiet; during (ms) | clearing (s) | expiries/s |"
    )
    print("|---|---|---:|---|---|---:|---|---:|---:|")
    for r in rounds:
        quiet = _figures(r.requests, r.due_at - 30, r.due_at - 0.2)
        during = _figures(r.requests, r.first - 0.05, r.last + 0.05)
        probe_quiet = _figures(r.probes, r.due_at - 30, r.due_at - 0.2)
        probe_during = _figures(r.probes, r.first - 0.05, r.last + 0.05)
        clearing = r.last - r.first
        rate = backlog / clearing if clearing > 0 else float("nan")
        pq = f"{percentile(probe_quiet, 99):.1f} / {max(probe_quiet):.1f}" if probe_quiet else "n/a"
        pd = f"{percentile(probe_during, 99):.1f} / {max(probe_during):.1f}" if probe_during else "n/a"
        print(
            f"| {r.database} | {r.route} | {r.number} | "
            f"{_line(quiet)} | {_line(during)} | {len(during)} | {pq}; {pd} | {clearing:.2f} | {rate:.0f} |"
        )
        for problem in r.problems:
            print(f"PROBLEM ({r.database}, {r.route}): {problem}")


async def breakdown(kind: str, batch: int, backlog: int, tmp: Path, index: int) -> str:
    """One backlog expired `batch` at a time in this process, back to back: the loop's stalls and each part's time."""
    import service.store
    from service import logs
    from service.app import build_runtime
    from service.config.loader import load_settings
    from service.store import migrate
    from service.store.tables import elicitations
    from service.vault import generate_key

    async with database(kind, tmp, index) as url:
        migrate(url)
        with open(os.devnull, "w") as devnull:  # noqa: ASYNC230 - /dev/null
            logs.configure("json", stream=devnull)
            env = {
                **connector_env(free_port(), url, generate_key("k1"), tmp / "providers.toml"),
                "CONNECTOR_PROVIDER_BENCH_CLIENT_ID": "bench",
                "CONNECTOR_PROVIDER_BENCH_CLIENT_SECRET": "bench-secret",
            }
            runtime = build_runtime(load_settings(None, env=env))
            await runtime.start()
            await runtime.sweeper.close()  # this measurement expires the backlog itself
            try:
                async with runtime.store.transaction() as tx:
                    await tx.execute(insert(elicitations), _elicitation_rows(backlog, datetime.now(UTC)))
                spent: dict[str, float] = {}

                def timed(owner: object, name: str, part: str) -> None:
                    original = getattr(owner, name)
                    if asyncio.iscoroutinefunction(original):

                        async def measured(*args: object, **kwargs: object) -> object:
                            began = time.perf_counter()
                            try:
                                return await original(*args, **kwargs)
                            finally:
                                spent[part] = spent.get(part, 0.0) + time.perf_counter() - began

                        setattr(owner, name, measured)
                    else:

                        def measured_sync(*args: object, **kwargs: object) -> object:
                            began = time.perf_counter()
                            try:
                                return original(*args, **kwargs)
                            finally:
                                spent[part] = spent.get(part, 0.0) + time.perf_counter() - began

                        setattr(owner, name, measured_sync)

                store = runtime.store
                timed(store.elicitations, "expire_due", "UPDATE")
                timed(store.audit, "record_many", "audit insert")
                timed(store.outbox, "append", "event-log append")
                timed(service.store, "log_audit_event", "audit lines")
                timed(runtime.elicitations, "ended", "events published")
                lateness: list[float] = []

                async def sleeper() -> None:
                    while True:
                        began = time.perf_counter()
                        await asyncio.sleep(0.001)
                        lateness.append((time.perf_counter() - began) * 1000 - 1)

                watching = asyncio.create_task(sleeper())
                await asyncio.sleep(0.1)
                lateness.clear()
                batches = 0
                began = time.perf_counter()
                while await runtime.elicitations.expire_due(limit=batch) == batch:
                    batches += 1
                took = time.perf_counter() - began
                watching.cancel()
                parts = ", ".join(f"{part} {seconds * 1000 / (batches + 1):.1f}" for part, seconds in spent.items())
                return (
                    f"| {kind} | {batch} | {percentile(lateness, 99):.1f} / {max(lateness):.1f} | "
                    f"{took * 1000 / (batches + 1):.1f} ({parts}) | {backlog / took:.0f} |"
                )
            finally:
                await runtime.close()


async def breakdowns(args: argparse.Namespace) -> None:
    print(machine())
    print()
    print("| database | batch | loop stall p99 / max (ms) | a batch (ms), of which | expiries/s, back to back |")
    print("|---|---:|---|---|---:|")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "providers.toml").write_text(
            '[bench]\ndisplay_name = "Bench API"\nauthorization_endpoint = "http://127.0.0.1:9/authorize"\n'
            'token_endpoint = "http://127.0.0.1:9/token"\napi_base_url = "http://127.0.0.1:9/api"\n'
        )
        index = 0
        for kind in args.databases.split(","):
            for batch in (int(b) for b in args.breakdown.split(",")):
                index += 1
                print(await breakdown(kind, batch, args.backlog, tmp, index), flush=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{args.backlog} due elicitations a run; load average at the end {load}; {datetime.now(UTC):%H:%M} UTC")


async def main(args: argparse.Namespace) -> None:
    from service.store import migrate

    _ = migrate  # imported here so that a missing dependency fails before anything starts
    print(machine())
    routes: dict[str, Path] = {"this": ROOT}
    if args.compare_with:
        routes = {"before": args.compare_with, "after": ROOT}
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        (tmp / "providers.toml").write_text(
            f'[bench]\ndisplay_name = "Bench API"\nauthorization_endpoint = "{upstream}/authorize"\n'
            f'token_endpoint = "{upstream}/token"\napi_base_url = "{upstream}/api"\n'
        )
        with open(tmp / "upstream.log", "wb") as up_log:  # noqa: ASYNC230 - before anything runs
            api = await asyncio.create_subprocess_exec(
                sys.executable,
                str(ROOT / "bench" / "proxy.py"),
                "--upstream",
                str(up_port),
                stdout=up_log,
                stderr=up_log,
            )
            try:
                await wait_until_up(f"{upstream}/api/small")
                index = 0
                for kind in args.databases.split(","):
                    for n in range(args.rounds):
                        # Alternate which route goes first: a machine that drifts weighs on both alike.
                        order = list(routes.items()) if n % 2 == 0 else list(reversed(routes.items()))
                        for route, checkout in order:
                            index += 1
                            rounds.append(
                                await one_round(
                                    route, n + 1, checkout, kind, index, args.backlog, args.quiet, upstream, tmp
                                )
                            )
            finally:
                api.terminate()
                await api.wait()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{args.backlog} due elicitations a round; load average at the end {load}; {datetime.now(UTC):%H:%M} UTC")
    print()
    rounds.sort(key=lambda r: (r.database, r.route, r.number))
    report(rounds, args.backlog)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--quiet", type=float, default=4.0, help="seconds of quiet measurement before the backlog")
    parser.add_argument("--compare-with", help="another checkout's sidecar as 'before' (e.g. a worktree of main)")
    parser.add_argument("--breakdown", help="batch sizes: where a batch's time goes, in this process (no sidecar)")
    parsed = parser.parse_args()
    parsed.compare_with = Path(parsed.compare_with).resolve() if parsed.compare_with else None
    asyncio.run(breakdowns(parsed) if parsed.breakdown else main(parsed))
