"""Two benchmark agents side by side in one run: CPU per connect flow and callback -> `elicitation/complete`.

On a shared machine only figures taken in the same minutes compare. This runs agent A and agent B (bench/agent.py,
each in its own process with ACP over stdio, each on its own SQLite database), the baseline app and the mock
provider of bench/flow.py, and alternates them:
- throughput rounds at concurrency 4 (baseline, A, B, in turn): each agent's CPU per flow against the baseline app's;
- latency blocks of sequential flows (A, B, in turn): callback -> `elicitation/complete` p50/p99 for each. With
  `--gc DIR`, each agent logs its garbage collections (bench/gcprobe.py): collections per flow, their time, and how many
  of the slowest 5 % of callbacks had a collection (by generation) inside them.

An agent differs by environment (`--a-env`/`--b-env NAME=VALUE`, e.g. a BENCH_* switch bench/agent.py reads) or by
code (`--a-repo`/`--b-repo`: another worktree's checkout; this one's by default).

    .venv/bin/python -m bench.agent_ab --b-env BENCH_GC_FREEZE=1 [--rounds 6] [--latency-blocks 6] [--gc]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.driver import AgentDriver, Result, run_flows
from bench.flow import connector_agent, measured, mock_provider_and_baseline
from bench.gcprobe import collections, during
from bench.harness import REPO, machine, median, percentile


@dataclass
class Side:
    name: str
    env: dict[str, str]
    repo: Path
    gc_log: Path | None = None
    trace_log: Path | None = None
    cpu: list[float] = field(default_factory=list)  # agent ms per flow, one a round
    ratios: list[float] = field(default_factory=list)  # against the baseline app in the same round
    latencies: list[float] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)  # (callback sent, completion), perf_counter
    gc_since: float = 0.0  # the latency blocks' start


def _env(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


async def latency_block(agent: AgentDriver, side: Side, flows: int) -> None:
    before = set(agent.client.flows)
    result = await run_flows(agent.flow, flows, 1)
    await asyncio.sleep(0.1)
    new = [f for k, f in agent.client.flows.items() if k not in before]
    checked = Result()
    agent.settle(checked, new)
    if checked.lost or checked.duplicated or result.errors:
        raise RuntimeError(f"{side.name}: {result.errors} errors, {checked.lost} lost, {checked.duplicated} duplicated")
    side.latencies += checked.latencies_ms
    side.windows += [(f.callback_sent, f.completions[0]) for f in new if f.callback_sent and f.completions]


def gc_totals(side: Side, since: float, until: float, flows: int) -> list[str]:
    """Collections per flow and their time per flow over [since, until), `flows` flows."""
    if side.gc_log is None:
        return []
    logged = collections(side.gc_log, since, until)
    counts = " / ".join(f"{sum(1 for c in logged if c.generation == g) / flows:.3f}" for g in (0, 1, 2))
    ms = [sum(c.seconds for c in logged if c.generation == g) * 1000 / flows for g in (0, 1, 2)]
    longest = max((c.seconds * 1000 for c in logged), default=0.0)
    return [
        f"| {side.name}, throughput rounds: collections per flow, gen 0 / 1 / 2 | {counts} | | |",
        f"| {side.name}, throughput rounds: collection time per flow, ms, gen 0 / 1 / 2 (longest one) "
        f"| {' / '.join(f'{x:.3f}' for x in ms)} ({longest:.1f}) | | |",
    ]


def gc_rows(side: Side, flows: int) -> list[str]:
    if side.gc_log is None:
        return []
    logged = collections(side.gc_log, since=side.gc_since)
    by_gen = {g: [c for c in logged if c.generation == g] for g in (0, 1, 2)}
    per_flow = " / ".join(f"{len(by_gen[g]) / max(flows, 1):.2f}" for g in (0, 1, 2))
    ms_per_flow = sum(c.seconds for c in logged) * 1000 / max(flows, 1)
    gen2_ms = [c.seconds * 1000 for c in by_gen[2]]
    slow_cut = percentile(side.latencies, 95)
    slow = [w for w, ms in zip(side.windows, side.latencies, strict=True) if ms >= slow_cut]
    fast = [w for w, ms in zip(side.windows, side.latencies, strict=True) if ms < slow_cut]

    def hit(windows: list[tuple[float, float]], gen: int) -> str:
        n = sum(1 for w in windows if any(c.generation == gen for c in during(logged, *w)))
        return f"{n}/{len(windows)}"

    return [
        f"| {side.name}, latency blocks: collections per flow, gen 0 / 1 / 2 | {per_flow} | | |",
        f"| {side.name}, latency blocks: collection time per flow; gen 2 each | {ms_per_flow:.3f} ms; gen 2 median "
        f"{median(gen2_ms):.2f} ms, max {max(gen2_ms, default=0):.2f} ms | | |",
        f"| {side.name}: callbacks with a collection inside, slowest 5 % (>= {slow_cut:.1f} ms) / the rest "
        f"| gen 2: {hit(slow, 2)} / {hit(fast, 2)}; gen 1: {hit(slow, 1)} / {hit(fast, 1)}; gen 0: "
        f"{hit(slow, 0)} / {hit(fast, 0)} | | |",
    ]


def _segments(path: Path, since: float) -> dict[str, list[tuple[float, float, float]]]:
    """(wall ms, process CPU ms, the event loop's thread's CPU ms) of each segment of the sequential flows traced
    since `since`: from each mark to the next, a flow's marks starting at its `callback`."""
    marks = []
    for line in path.read_text().splitlines():
        at, point, _, cpu, loop_cpu = line.split()
        if float(at) >= since:
            marks.append((float(at), point, float(cpu), float(loop_cpu)))
    marks.sort()
    out: dict[str, list[tuple[float, float, float]]] = {}
    previous = None
    for mark in marks:
        if mark[1] == "callback":
            previous = mark
            continue
        if previous is None:
            continue
        spent = ((mark[0] - previous[0]) * 1000, (mark[2] - previous[2]) * 1000, (mark[3] - previous[3]) * 1000)
        out.setdefault(f"{previous[1]} -> {mark[1]}", []).append(spent)
        previous = mark
    return out


def trace_rows(a: Side, b: Side, since: float) -> list[str]:
    if a.trace_log is None or b.trace_log is None:
        return []
    ours, theirs = _segments(a.trace_log, since), _segments(b.trace_log, since)
    rows = [
        "",
        "| segment (sequential flows) | A: wall p50 / p99; CPU p50, process / loop thread, ms | B: the same | n |",
    ]
    rows.append("|---|---|---|---|")
    for name, values in sorted(ours.items(), key=lambda item: -len(item[1])):
        other = theirs.get(name, [])

        def cell(v: list[tuple[float, float, float]]) -> str:
            walls, cpus, loops = [w for w, _, _ in v], [c for _, c, _ in v], [t for _, _, t in v]
            return (
                f"{percentile(walls, 50):.2f} / {percentile(walls, 99):.2f}; "
                f"{percentile(cpus, 50):.2f} / {percentile(loops, 50):.2f}"
            )

        rows.append(f"| {name} | {cell(values)} | {cell(other)} | {len(values)} / {len(other)} |")
    return rows


async def main(a: Side, b: Side, *, rounds: int, flows: int, blocks: int, block: int) -> list[str]:
    rows = [f"Measured on: {machine()}", "", "| measure | A | B | B / A |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for side in (a, b):
            if side.gc_log is not None:
                side.gc_log.mkdir(parents=True, exist_ok=True)
                side.gc_log = side.gc_log / f"gc-{side.name}.log"
                side.gc_log.unlink(missing_ok=True)
                side.env["BENCH_GC_LOG"] = str(side.gc_log)
            if side.trace_log is not None:
                side.trace_log.mkdir(parents=True, exist_ok=True)
                side.trace_log = side.trace_log / f"trace-{side.name}.log"
                side.trace_log.unlink(missing_ok=True)
                side.env["BENCH_TRACE"] = str(side.trace_log)
        async with mock_provider_and_baseline() as peers, contextlib.AsyncExitStack() as stack:
            agents = {}
            for side in (a, b):
                db = f"sqlite+aiosqlite:///{work}/{side.name}.db"
                agents[side.name] = await stack.enter_async_context(
                    connector_agent(peers.provider, db, work, side.env, repo=side.repo)
                )
            for side in (a, b):
                await run_flows(agents[side.name].flow, 20, 4)  # warm up
            await run_flows(peers.baseline.flow, 20, 4)
            app: list[float] = []
            started = time.perf_counter()
            for r in range(rounds):  # alternate, and swap A and B's order each round
                _, base_cpu = await measured(peers.baseline.flow, flows, 4, {"app": peers.baseline_pid})
                app.append(base_cpu["app"])
                for side in (a, b) if r % 2 == 0 else (b, a):
                    agent = agents[side.name]
                    assert agent.pid is not None
                    result, cpu = await measured(agent.flow, flows, 4, {"agent": agent.pid})
                    if result.errors:
                        raise RuntimeError(f"{side.name}: {result.error_samples}")
                    side.cpu.append(cpu["agent"])
                    side.ratios.append(cpu["agent"] / base_cpu["app"])
            throughput_gc = [
                row for side in (a, b) for row in gc_totals(side, started, time.perf_counter(), rounds * flows)
            ]
            for side in (a, b):
                side.gc_since = time.perf_counter()
            traced_since = time.time()
            for i in range(blocks):
                for side in (a, b) if i % 2 == 0 else (b, a):
                    await latency_block(agents[side.name], side, block)
    gc_table = throughput_gc + [row for side in (a, b) for row in gc_rows(side, len(side.latencies))]
    trace_table = trace_rows(a, b, traced_since)
    cpu_a, cpu_b = median(a.cpu), median(b.cpu)
    rows.append(
        f"| agent CPU per flow, ms (median of {rounds} rounds of {flows} at concurrency 4; baseline app "
        f"{median(app):.2f} ms) | {cpu_a:.2f} | {cpu_b:.2f} | **{cpu_b / cpu_a:.3f}x** |"
    )
    rows.append(
        f"| ... against the baseline app in the same round (median) | {median(a.ratios):.2f}x "
        f"| {median(b.ratios):.2f}x | |"
    )
    rows.append(
        "| ... each round, B / A | " + ", ".join(f"{y / x:.2f}" for x, y in zip(a.cpu, b.cpu, strict=True)) + " | | |"
    )
    for q in (50, 90, 99):
        pa, pb = percentile(a.latencies, q), percentile(b.latencies, q)
        rows.append(
            f"| callback -> `elicitation/complete` p{q}, ms ({len(a.latencies)} sequential flows each, {blocks} "
            f"alternating blocks) | {pa:.2f} | {pb:.2f} | {pb / pa:.2f}x |"
        )
    rows.append(f"| ... max, ms | {max(a.latencies):.2f} | {max(b.latencies):.2f} | |")
    rows += gc_table
    rows += trace_table
    rows.append(f"Load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--a-repo", type=Path, default=REPO)
    parser.add_argument("--b-repo", type=Path, default=REPO)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--flows", type=int, default=100, help="flows per throughput round")
    parser.add_argument("--latency-blocks", type=int, default=6)
    parser.add_argument("--block", type=int, default=50, help="sequential flows per latency block")
    parser.add_argument(
        "--gc", type=Path, metavar="DIR", help="log each agent's garbage collections there (bench/gcprobe.py)"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        metavar="DIR",
        help="mark each agent's completion path there (bench/trace.py): wall and CPU time of each segment",
    )
    args = parser.parse_args()
    gc_log = args.gc.resolve() if args.gc else None
    trace_log = args.trace.resolve() if args.trace else None
    side_a = Side("A", _env(args.a_env), args.a_repo.resolve(), gc_log, trace_log)
    side_b = Side("B", _env(args.b_env), args.b_repo.resolve(), gc_log, trace_log)
    out = asyncio.run(
        main(side_a, side_b, rounds=args.rounds, flows=args.flows, blocks=args.latency_blocks, block=args.block)
    )
    print("\n".join(out))
