"""100,000 awaited pending elicitations across four processes on one PostgreSQL, against none: CPU per flow, memory.

    BENCH_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test .venv/bin/python -m bench.pending \\
        [--processes 4] [--pending 100000] [--flows 60]

Each of `--processes` worker processes runs the connector as `bench/load.py` does (its web server and a mock
provider on loopback, ACP over the SDK's in-memory transport) on one scratch PostgreSQL database. Rounds, every worker
at once: connect flows with nothing pending (CPU time of the worker per flow, concurrency 4), then each worker holds
`pending / processes` authorizations it awaits (created, accepted, waiting for a browser that never comes; its RSS
before and after, settled), flows again with all of them pending, then the pendings released and flows once more.
Goal: flat per-flow cost (CPU per flow with the pendings / the mean of the two rounds without, <= 1.1x), and memory
per awaited pending (goal <= 2 KB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import REPO, machine, postgres_database
from service.store import migrate

# Unanswered asks a worker keeps in flight while it creates its pendings: a window, not batches with a pause
# between them. (200 at once in each of four processes on two CPUs made some wait for a pooled connection longer than
# the pool's timeout; the window bounds the asks, and the accepts' writes trail them.)
HOLD_WINDOW = 25
WARM = 500  # pendings held first, before the memory is measured


async def worker(database_url: str) -> None:
    """Answers the coordinator's commands on stdin, one JSON line each on stdout."""
    from bench.driver import run_flows
    from bench.load import deployment, settled_rss

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(body: dict[str, float]) -> None:
        sys.stdout.write(json.dumps(body) + "\n")
        sys.stdout.flush()

    with tempfile.TemporaryDirectory() as tmp:
        # Creating 25,000 pendings a process takes longer than an elicitation's default 10 minutes: none may expire.
        # At most 15 pooled connections a worker (not the default 20): four workers at 20, their listeners and their
        # heartbeats' own connections reached the server's 100 (the heartbeat, and another client, were refused).
        settings = {"CONNECTOR_ELICITATION__TTL_SECONDS": "7200", "CONNECTOR_DATABASE__MAX_OVERFLOW": "5"}
        async with deployment(Path(tmp), database_url, settings) as d:
            await run_flows(d.driver.flow, 10, 2)  # warm up
            say({"ready": 1})
            while line := (await reader.readline()).decode().split():
                try:
                    command, n = line[0], int(line[1])
                    if command == "flows":
                        cpu, wall = time.process_time(), time.perf_counter()
                        done = await run_flows(d.driver.flow, n, 4)
                        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                        say({"cpu_ms": cpu * 1000 / max(done.flows, 1), "flows": done.flows, "wall_s": wall})
                    elif command == "hold":
                        started = time.perf_counter()
                        # The first ones open the pool's connections and fill their statement caches: a cost of the
                        # process, not of each pending, so the memory is measured over the rest.
                        first = min(WARM, n // 10)
                        await d.hold(first, HOLD_WINDOW)
                        await asyncio.sleep(1)
                        before = settled_rss()
                        await d.hold(n - first, HOLD_WINDOW)
                        await asyncio.sleep(2)
                        say(
                            {
                                "bytes_each": (settled_rss() - before) / max(n - first, 1),
                                "first": first,
                                "held": len(d.waiting),
                                "s": time.perf_counter() - started,
                            }
                        )
                    elif command == "release":
                        await d.release()
                        say({"released": 1})
                except Exception as exc:  # told to the coordinator, which stops
                    say({"error": f"{type(exc).__name__}: {exc}"[:300]})  # type: ignore[dict-item]


async def coordinate(processes: int, pending: int, flows: int) -> list[str]:
    admin = os.environ.get("BENCH_POSTGRES_URL") or os.environ.get("CONNECTOR_TEST_POSTGRES_URL")
    if not admin:
        return [
            "Skipped: needs PostgreSQL (BENCH_POSTGRES_URL, e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test)."
        ]
    began = time.perf_counter()
    out = [f"Measured on {machine()}.", ""]
    async with postgres_database(admin) as url:
        migrate(url)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        procs = []
        errors = (Path(tempfile.gettempdir()) / "bench-pending-workers.log").open("ab")  # the workers' stderr
        for _ in range(processes):  # one at a time: each migrates (a no-op) and warms up
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.pending",
                "--worker",
                url,
                cwd=REPO,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
            )
            procs.append(proc)
            await answer(proc)

        async def everyone(command: str) -> list[dict[str, float]]:
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"{command}\n".encode())
                await proc.stdin.drain()
            return list(await asyncio.gather(*(answer(p) for p in procs)))

        try:
            quiet_before = await everyone(f"flows {flows}")
            held = await everyone(f"hold {pending // processes}")
            loaded = await everyone(f"flows {flows}")
            await everyone("release 0")
            quiet_after = await everyone(f"flows {flows}")
        finally:
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.close()
            for proc in procs:
                await proc.wait()
            errors.close()

    def mean(rows: list[dict[str, float]], key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    none = (mean(quiet_before, "cpu_ms") + mean(quiet_after, "cpu_ms")) / 2
    with_pending = mean(loaded, "cpu_ms")
    ratio = with_pending / none
    per = mean(held, "bytes_each")
    total = sum(int(r["held"]) for r in held)
    out += [
        "| measure | value | goal | |",
        "|---|---|---|---|",
        f"| CPU per connect flow (worker process, concurrency 4, {flows} flows a worker a round), {total:,} awaited "
        f"pendings across {processes} processes vs none (mean of before and after) | {with_pending:.1f} ms vs "
        f"{none:.1f} ms ({mean(quiet_before, 'cpu_ms'):.1f} before, {mean(quiet_after, 'cpu_ms'):.1f} after): "
        f"**{ratio:.2f}x** | flat (<= 1.1x) | {'met' if ratio <= 1.1 else '**not met**'} |",
        f"| RSS per awaited pending ({pending // processes:,} in each process, settled; measured over all but the "
        f"first {int(held[0]['first']):,} of each, which open the pool's connections) | {per / 1024:.2f} KB "
        f"| <= 2 KB | {'met' if per <= 2048 else '**not met**'} |",
        f"| time to create and accept {pending // processes:,} pendings in each process at once | "
        f"{max(r['s'] for r in held):.0f} s | | |",
        "",
        f"{(time.perf_counter() - began) / 60:.1f} minutes; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
    ]
    return out


async def answer(proc: asyncio.subprocess.Process) -> dict[str, float]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 1800)
    if not line:
        raise SystemExit("a worker ended")
    body: dict[str, float] = json.loads(line)
    if "error" in body:
        raise SystemExit(f"a worker failed: {body['error']}")
    return body


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--pending", type=int, default=100_000, help="awaited pendings across the processes")
    parser.add_argument("--flows", type=int, default=60, help="flows per worker per round")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="4,000 pendings and 20 flows a round (a smoke run)")
    options = parser.parse_args()
    if options.quick:
        options.pending, options.flows = 4_000, 20
    if options.worker:
        asyncio.run(worker(options.worker))
    else:
        print("\n".join(asyncio.run(coordinate(options.processes, options.pending, options.flows))))
