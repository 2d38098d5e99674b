"""LISTEN/NOTIFY fan-out: what one completion costs each replica, at 1, 2, 4 and 8 replicas on one PostgreSQL.

    BENCH_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test .venv/bin/python -m bench.fanout \\
        [--events 300] [--rate 25] [--replicas 1,2,4,8]

For each count N, N replicas (`acp-connector serve`, each under `bench/trace.py`) listen on one scratch database;
this process is one more replica that completes elicitations: each event is logged in its own transaction and
announced as a replica announces a completion (`PgBus.publish`: one NOTIFY on its listening connection), `--rate` a
second. Each listening replica hears it, takes it from the notification (or reads the event log) and hands it to its
listeners (none of them holds the connection, so none tells it: the cost every replica but one pays).

Reported per N: CPU per event per replica (the replica process, minus its idle CPU over as long a quiet window
measured just before), the CPU of its listening backend in PostgreSQL the same way, and the latency from the NOTIFY
sent to the event handed on, at every replica (p50, p99). Flat rows across N mean the fan-out costs each replica the
same whatever the number of replicas; the sender's cost (one NOTIFY) does not grow with N either.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx

from bench.harness import REPO, connector_env, cpu_ms, free_port, machine, percentile, postgres_database
from bench.replicas import read_trace
from bench.scale_data import dsn
from service.core.events import ElicitationEvent
from service.core.states import ElicitationStatus
from service.events.pg import PgBus
from service.metrics import Metrics
from service.store import Store, migrate
from service.vault import generate_key


@contextlib.asynccontextmanager
async def replicas(n: int, url: str, trace: Path, workdir: Path) -> AsyncIterator[list[int]]:
    """`n` traced `acp-connector serve` processes on `url`; their process ids once all answer."""
    catalog = workdir / "providers.toml"
    catalog.write_text(
        '[bench]\ndisplay_name = "Bench"\nauthorization_endpoint = "http://127.0.0.1:9/authorize"\n'
        'token_endpoint = "http://127.0.0.1:9/token"\n'
    )
    (workdir / "connector.toml").write_text("")
    vault_key = generate_key("k1")
    procs, bases = [], []
    log = (workdir / "replicas.log").open("ab")
    for _ in range(n):
        port = free_port()
        env = {
            **connector_env(port, url, vault_key, catalog),
            "CONNECTOR_CONFIG": str(workdir / "connector.toml"),
            "CONNECTOR_PROVIDER_BENCH_CLIENT_ID": "bench",
            "CONNECTOR_PROVIDER_BENCH_CLIENT_SECRET": "bench-secret",
            "CONNECTOR_LOG_FORMAT": "json",
            "BENCH_TRACE": str(trace),
            "PYTHONPATH": str(REPO),
        }
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.trace", "-m", "service.cli", "serve", env=env, cwd=REPO, stderr=log
            )
        )
        bases.append(f"http://127.0.0.1:{port}")
    try:
        async with httpx.AsyncClient() as http:
            for base in bases:
                for _ in range(1200):
                    with contextlib.suppress(httpx.TransportError):
                        if (await http.get(f"{base}/readyz")).status_code == 200:
                            break
                    await asyncio.sleep(0.05)
                else:
                    raise SystemExit("a replica did not become ready")
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            await p.wait()
        log.close()


async def listening_backends(url: str) -> list[int]:
    """The PostgreSQL backends of the replicas' listening connections."""
    conn = await asyncpg.connect(dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'acp-connector listen%'"
        )
    finally:
        await conn.close()
    return [int(r["pid"]) for r in rows]


def cpu_of(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = cpu_ms(pid)
    return out


async def one_count(n: int, url: str, events: int, rate: float, workdir: Path) -> dict[str, float]:
    trace = workdir / f"trace-{n}.log"
    async with replicas(n, url, trace, workdir) as pids:
        store = Store.from_url(url)
        bus = PgBus(store, metrics=Metrics(), clock=lambda: datetime.now(UTC), ping_seconds=30)
        await bus.start()
        try:
            await asyncio.sleep(2)  # the replicas settle (their first heartbeat, the feed's first read)
            backends = [b for b in await listening_backends(url) if b not in await own_backend(bus)]
            window = events / rate
            idle_start, started = cpu_of(pids + backends), time.perf_counter()
            await asyncio.sleep(window)
            idle_end, idle_took = cpu_of(pids + backends), time.perf_counter() - started
            busy_start, started = cpu_of(pids + backends), time.perf_counter()
            for i in range(events):
                async with store.transaction() as tx:
                    (logged,) = await store.outbox.append(
                        [ElicitationEvent(f"fanout-{uuid.uuid4().hex[:12]}", ElicitationStatus.COMPLETED, "v1:x:c")],
                        at=datetime.now(UTC),
                        conn=tx,
                    )
                bus.publish(logged)
                await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.perf_counter()))
            await asyncio.sleep(1.0)  # the last events heard
            busy_end, busy_took = cpu_of(pids + backends), time.perf_counter() - started
        finally:
            await bus.close()
            await store.close()
        sender = os.getpid()

    def per_event(of: list[int]) -> float:
        idle = sum(idle_end[p] - idle_start[p] for p in of if p in idle_end) / idle_took
        busy = sum(busy_end[p] - busy_start[p] for p in of if p in busy_end)
        return (busy - idle * busy_took) / events / max(1, len(of))

    marks = read_trace(trace)
    sent = [at for at, point, pid in marks if point == "notify.start" and pid == sender]
    latencies: list[float] = []
    unheard = 0
    for pid in pids:
        handed = [at for at, point, p in marks if point == "feed" and p == pid]
        j = 0
        for at in sent:
            while j < len(handed) and handed[j] < at:
                j += 1
            if j < len(handed):
                latencies.append((handed[j] - at) * 1000)
                j += 1
            else:
                unheard += 1
    return {
        "replica_cpu": per_event(pids),
        "backend_cpu": per_event(backends),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "unheard": unheard,
        "sent": len(sent),
    }


async def own_backend(bus: PgBus) -> list[int]:
    listener = bus._listener
    return [] if listener is None else [int(listener._connection.get_server_pid())]


async def main(counts: list[int], events: int, rate: float) -> None:
    admin_url = os.environ.get("BENCH_POSTGRES_URL") or os.environ.get("CONNECTOR_TEST_POSTGRES_URL")
    if not admin_url:
        print("Skipped: needs PostgreSQL (BENCH_POSTGRES_URL, e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test).")
        return
    from bench.trace import install, retarget

    began = time.perf_counter()
    print(f"Measured on {machine()}.\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        install(str(Path(tmp) / "sender.log"))  # this process's NOTIFYs are marked in each count's trace below
        async with postgres_database(admin_url, prefix="connector_bench") as url:
            migrate(url)
            for n in counts:
                retarget(str(Path(tmp) / f"trace-{n}.log"))
                rows.append((n, await one_count(n, url, events, rate, Path(tmp))))
    print(f"{events} completions announced at {rate:.0f}/s by one more replica (ms):\n")
    print(
        "| replicas listening | CPU per event per replica | its PostgreSQL backend's | latency p50 | p99 | not heard |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for n, r in rows:
        print(
            f"| {n} | {r['replica_cpu']:.3f} | {r['backend_cpu']:.3f} | {r['p50']:.2f} | {r['p99']:.2f} | "
            f"{r['unheard']} of {r['sent'] * n} |"
        )
    first, last = rows[0][1], rows[-1][1]
    print(
        f"\nAt {rows[-1][0]} replicas against {rows[0][0]}: CPU per event per replica "
        f"{last['replica_cpu'] / first['replica_cpu']:.2f}x, latency p50 {last['p50'] / first['p50']:.2f}x, "
        f"p99 {last['p99'] / first['p99']:.2f}x."
    )
    load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{(time.perf_counter() - began) / 60:.1f} minutes; load average at the end {load_average}.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300, help="completions announced per replica count")
    parser.add_argument("--rate", type=float, default=25.0, help="completions a second")
    parser.add_argument("--replicas", default="1,2,4,8", help="replica counts, comma-separated")
    parser.add_argument("--quick", action="store_true", help="60 completions at 1 and 2 replicas (a smoke run)")
    options = parser.parse_args()
    if options.quick:
        options.events, options.replicas = 60, "1,2"
    asyncio.run(main([int(n) for n in options.replicas.split(",")], options.events, options.rate))
