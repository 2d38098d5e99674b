"""A soak: connect flows at a steady rate for `--minutes`, the agent's memory sampled, and what stays in it named.

Processes (all on 127.0.0.1): the mock provider (bench/mock.py), the benchmark agent with the connector embedded
(bench/agent.py, over stdio by the official SDK client in this driver; rate limits on, with per-address limits high
enough for one driver), and this driver, which plays the browsers, each flow as a user of its own.

1. Warm-up: `--warmup` flows, then the agent settles (a collection and `malloc_trim`, bench/memory.py) and its RSS
   is read: the start.
2. The soak: a flow started every 1/`--rate` s (at most 8 at a time) for `--minutes`; the agent's RSS is sampled
   every `--sample` s (as it is, no settling: the curve a process monitor would see).
3. Settled again: RSS kept per completed flow = (settled end - settled start) / flows (goal <= 0.3 KB per flow);
   and once more after IDLE_SECONDS with no flows (what is bounded by time, e.g. the rate-limit windows, has gone).
   "Flat": the second half of the soak's samples grows by no more than 0.3 KB per flow of that half.
4. The growers: `tracemalloc` on in the agent for `--trace-flows` more flows at the same rate, then what those
   flows left alive, by traceback (the largest first, per flow), and the object types whose count grew.

    .venv/bin/python -m bench.soak [--minutes 60] [--rate 4] [--quick]

BENCH_SOAK_JSON=path also writes the samples and the growers with their stacks there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.driver import TLS, AgentDriver, Result, run_flows
from bench.flow import CLIENT_ID, CLIENT_SECRET, connector_agent
from bench.harness import children, cpu_ms, free_port, machine, wait_until_up
from bench.memory import await_file, rss_kb

GOAL_KB = 0.3
IDLE_SECONDS = 65  # after the soak, before the last settled reading: the rate-limit window (60 s) and its sweep
IN_FLIGHT = 8
RATE_LIMITS = {  # on, as deployed: the per-elicitation buckets count; one driver's address may send every flow
    "CONNECTOR_RATE_LIMIT__ENABLED": "true",
    "CONNECTOR_RATE_LIMIT__CONNECT_PER_ADDRESS": "1000000",
    "CONNECTOR_RATE_LIMIT__CALLBACK_PER_ADDRESS": "1000000",
}


@dataclass
class Sample:
    seconds: float
    flows: int
    rss_kb: int
    cpu_ms: float


@dataclass
class Soak:
    driver: AgentDriver
    pid: int
    probe: Path
    result: Result = field(default_factory=Result)
    samples: list[Sample] = field(default_factory=list)
    settled: int = 0
    parts: list[dict[str, int]] = field(default_factory=list)

    async def settle(self) -> int:
        """The agent's RSS (KB) after a collection and malloc_trim in it (its parts kept in `self.parts`)."""
        self.settled += 1
        os.kill(self.pid, signal.SIGUSR2)
        rss = int(await await_file(self.probe / f"settled-{self.settled}"))
        self.parts.append(json.loads(await await_file(self.probe / f"parts-{self.settled}")))
        return rss

    async def steady(self, rate: float, seconds: float, sample_every: float | None = None) -> None:
        """Flows started at `rate` per second for `seconds`, each with a browser of its own (at most IN_FLIGHT)."""
        browsers: asyncio.Queue[tuple[int, httpx.AsyncClient]] = asyncio.Queue()
        clients = [httpx.AsyncClient(verify=TLS, timeout=60.0, follow_redirects=False) for _ in range(IN_FLIGHT)]
        for index, client in enumerate(clients):
            browsers.put_nowait((index, client))
        running: set[asyncio.Task[None]] = set()

        async def one() -> None:
            index, browser = await browsers.get()
            try:
                await self.driver.flow(browser, index, self.result)
            finally:
                browsers.put_nowait((index, browser))

        loop = asyncio.get_running_loop()
        start = loop.time()
        sampler = asyncio.create_task(self._sample(start, sample_every)) if sample_every else None
        try:
            started = 0
            while (now := loop.time()) - start < seconds:
                due = start + started / rate
                if due > now:
                    await asyncio.sleep(due - now)
                task = asyncio.create_task(one())
                running.add(task)
                task.add_done_callback(running.discard)
                started += 1
            await asyncio.gather(*running)
        finally:
            if sampler is not None:
                sampler.cancel()
            for client in clients:
                await client.aclose()

    async def _sample(self, start: float, every: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.samples.append(Sample(loop.time() - start, self.result.flows, rss_kb(self.pid), cpu_ms(self.pid)))
            await asyncio.sleep(every)

    async def growers(self, rate: float, flows: int) -> dict[str, Any]:
        """What `flows` more flows leave alive in the agent (tracemalloc on meanwhile)."""
        os.kill(self.pid, signal.SIGUSR1)  # settle, count objects, start tracing
        await asyncio.sleep(1.0)
        before = self.result.flows
        await self.steady(rate, flows / rate)
        await asyncio.sleep(2.0)  # what a flow's end schedules (the telling, the audit) has run
        os.kill(self.pid, signal.SIGUSR1)
        report: dict[str, Any] = json.loads(await await_file(self.probe / "growers.json", within=600))
        report["flows"] = self.result.flows - before
        return report


def curve(samples: list[Sample], rows: int = 12) -> list[str]:
    step = max(1, len(samples) // rows)
    picked = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    return [
        f"| {s.seconds / 60:.1f} min | {s.flows:,} flows | {s.rss_kb / 1024:.1f} MB | {s.cpu_ms / 1000:.0f} s CPU |"
        for s in picked
    ]


def second_half_kb_per_flow(samples: list[Sample]) -> float:
    """Least-squares slope of RSS (KB) over completed flows, on the second half of the samples."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2 or half[-1].flows == half[0].flows:
        return float("nan")
    mean_x = sum(s.flows for s in half) / len(half)
    mean_y = sum(s.rss_kb for s in half) / len(half)
    cov = sum((s.flows - mean_x) * (s.rss_kb - mean_y) for s in half)
    var = sum((s.flows - mean_x) ** 2 for s in half)
    return cov / var


def parts_rows(parts: list[dict[str, int]], flows: int) -> list[str]:
    """The settled start and end by part: what grew, anonymous or file-backed, in SQLite's allocator or Python's."""
    if len(parts) < 2:
        return []
    start, end = parts[0], parts[1]
    names = {
        "anon_kb": "anonymous RSS (KB)",
        "file_kb": "file-backed RSS (KB)",
        "sqlite_kb": "held by SQLite's allocator (KB)",
        "sqlite_connections": "SQLite connections open",
        "sqlite_cache_kb": "... their page caches (KB)",
        "sqlite_schema_kb": "... their schemas (KB)",
        "sqlite_statements_kb": "... their prepared statements (KB)",
        "python_blocks": "Python's live blocks",
    }
    idle = parts[2] if len(parts) > 2 else {}
    rows = [
        f"| settled part | start | end | per flow | {IDLE_SECONDS} s after the flows stopped |",
        "|---|---|---|---|---|",
    ]
    for key, name in names.items():
        if key in start and key in end:
            grown = (end[key] - start[key]) / max(flows, 1)
            after = f"{idle[key]:,}" if key in idle else "-"
            rows.append(f"| {name} | {start[key]:,} | {end[key]:,} | {grown:+.2f} | {after} |")
    return rows


def grower_rows(report: dict[str, Any]) -> list[str]:
    flows = max(report["flows"], 1)
    rows = [
        f"Left alive by {report['flows']} more flows with `tracemalloc` on: {report['traced'] / 1024:.0f} KB in all, "
        f"{report['traced'] / flows / 1024:.2f} KB per flow. The largest, by traceback:",
        "",
        "| bytes per flow | blocks | allocated at | from (the connector's innermost frames) |",
        "|---|---|---|---|",
    ]
    for g in report["growers"]:
        where = "<br>".join(f"`{f}`" for f in g["from"]) or "-"
        rows.append(f"| {g['size'] / flows:.0f} | {g['count']} | `{g['allocated_at']}` | {where} |")
    objects = ", ".join(f"{name} +{count}" for name, count in report["objects"] if count >= flows // 10)
    rows.append("")
    rows.append(f"Object types that grew by at least one per ten flows: {objects or 'none'}.")
    return rows


async def main(minutes: float, rate: float, warmup: int, sample: float, trace_flows: int) -> list[str]:
    rows = [f"Measured on: {machine()}", ""]
    port = free_port()
    provider = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe"
        probe.mkdir()
        async with children() as group:
            group.start("-m", "bench.mock", str(port), CLIENT_ID, CLIENT_SECRET)
            await wait_until_up(f"{provider}/api/user")
            env = {**RATE_LIMITS, "BENCH_MEMORY_DIR": str(probe)}
            database = f"sqlite+aiosqlite:///{tmp}/soak.db"
            async with connector_agent(provider, database, Path(tmp), env) as driver:
                assert driver.pid is not None
                soak = Soak(driver, driver.pid, probe)
                await run_flows(driver.flow, warmup, 4)
                start_kb = await soak.settle()
                began = time.monotonic()
                await soak.steady(rate, minutes * 60, sample)
                elapsed = time.monotonic() - began
                end_kb = await soak.settle()
                flows, errors = soak.result.flows, soak.result.errors
                await asyncio.sleep(IDLE_SECONDS)  # no flows: what is bounded by time goes
                idle_kb = await soak.settle()
                report = await soak.growers(rate, trace_flows)
    if keep := os.environ.get("BENCH_SOAK_JSON"):  # the whole record: samples, growers with their stacks
        record = {
            "samples": [vars(s) for s in soak.samples],
            "start_kb": start_kb,
            "end_kb": end_kb,
            "idle_kb": idle_kb,
            "parts": soak.parts,
            **report,
        }
        Path(keep).write_text(json.dumps(record, indent=1))  # noqa: ASYNC240 - once, at the end
    per_flow = (end_kb - start_kb) / max(flows, 1)
    slope = second_half_kb_per_flow(soak.samples)
    rows += [
        f"{flows:,} flows in {elapsed / 60:.1f} min at {rate:g}/s after {warmup} to warm up; errors {errors}"
        + (f" ({'; '.join(soak.result.error_samples)})" if errors else "")
        + f"; agent CPU {soak.samples[-1].cpu_ms / max(soak.samples[-1].flows, 1):.1f} ms per flow (all of it, "
        "including the start).",
        "",
        "| measure | value | goal | |",
        "|---|---|---|---|",
        f"| RSS kept per completed flow (settled: collection and `malloc_trim`) | {per_flow:.2f} KB "
        f"({start_kb / 1024:.1f} -> {end_kb / 1024:.1f} MB) | <= {GOAL_KB} KB | "
        f"{'met' if per_flow <= GOAL_KB else 'NOT met'} |",
        f"| ... and after {IDLE_SECONDS} s with no flows (settled) | {(idle_kb - start_kb) / max(flows, 1):.2f} KB "
        f"({idle_kb / 1024:.1f} MB) | <= {GOAL_KB} KB | "
        f"{'met' if (idle_kb - start_kb) / max(flows, 1) <= GOAL_KB else 'NOT met'} |",
        f"| RSS growth over the soak's second half (samples as they are, least squares) | {slope:.2f} KB per flow "
        f"| flat (<= {GOAL_KB} KB per flow) | {'met' if slope <= GOAL_KB else 'NOT met'} |",
        "",
        *parts_rows(soak.parts, flows),
        "",
        "| time | completed | agent RSS | agent CPU |",
        "|---|---|---|---|",
        *curve(soak.samples),
        "",
        *grower_rows(report),
    ]
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0, help="how long the soak runs (default 3)")
    parser.add_argument("--rate", type=float, default=4.0, help="flows started per second (default 4)")
    parser.add_argument("--warmup", type=int, default=200, help="flows before the start is read (default 200)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between RSS samples (default 10)")
    parser.add_argument("--trace-flows", type=int, default=300, help="flows traced at the end (default 300)")
    parser.add_argument("--quick", action="store_true", help="one minute, 100 flows to warm up, 100 traced")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.warmup, args.trace_flows = 1.0, 100, 100
    out = asyncio.run(main(args.minutes, args.rate, args.warmup, args.sample, args.trace_flows))
    print("\n".join(out))
