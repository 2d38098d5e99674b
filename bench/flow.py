"""Whole connect flows, side by side: the connector against a minimal authlib + Starlette app, on loopback.

Processes (one process group, all on 127.0.0.1): the mock OAuth provider, the baseline app (bench/baseline.py),
the benchmark agent with the connector embedded (bench/agent.py, spawned over stdio by the official `acp` SDK
client in this driver), and this driver, which plays the browsers.

A connector flow: `session/prompt` -> `elicitation/create` (the client accepts) -> GET the consent page -> POST
Continue -> the provider's authorize -> the callback (code redeemed at the token endpoint, account read from
userinfo) -> `elicitation/complete` and the prompt's end. A baseline flow: GET /login -> the provider's authorize
-> the callback (the same token and userinfo calls). Both make the same provider round trips.

Reported:
- flows/s of each at the same concurrency, alternating rounds, and the ratio. Issue 32's goal is >= 0.5x
  "in-process", which is the same goal as the agent's CPU per flow <= 2x the baseline app's: the flows/s measured
  here are of every process on the machine's CPUs (agent, driver, mock provider), so the driver's and the mock
  provider's work per flow, larger for the connector's flow (ACP over stdio, two more browser requests), dilutes
  the ratio; the row is judged against 0.5x all the same;
- the CPU each process spends per flow meanwhile (agent or baseline app, driver, mock provider), the agent's
  against the baseline app's (the goal <= 2x), and the ratio the connector would reach if its process cost what
  the baseline app does: CPU per flow is what sets the ratio on a machine the flows keep busy, and it is steadier
  than flows/s on a shared one;
- callback -> `elicitation/complete` on the ACP wire (stdio): from the browser sending the callback request to the
  client receiving the notification, p50/p99 over sequential flows (goal p99 < 10 ms);
- a concurrency sweep (1/8/32/128) on SQLite and, with BENCH_POSTGRES_URL, PostgreSQL: flows/s, errors, lost and
  duplicated completions (goal 0, 0, 0).

    .venv/bin/python -m bench.flow [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from acp import PROTOCOL_VERSION
from acp.client.connection import ClientSideConnection
from acp.schema import ClientCapabilities, ElicitationCapabilities, ElicitationUrlCapabilities
from acp.transports import spawn_stdio_transport

from bench.driver import PER_FLOW_USERS, AgentDriver, BenchClient, FlowFn, Result, provider_catalog, run_flows
from bench.driver import Baseline as BaselineApp
from bench.harness import (
    PYTHON,
    REPO,
    children,
    connector_env,
    cpu_ms,
    free_port,
    machine,
    median,
    percentile,
    postgres_database,
    wait_until_up,
)
from service.store import migrate
from service.vault import generate_key

CLIENT_ID, CLIENT_SECRET = "bench-client", "bench-secret-" + uuid.uuid4().hex


# -- deployment ----------------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def connector_agent(
    provider: str, database_url: str, workdir: Path, extra_env: dict[str, str] | None = None, repo: Path = REPO
) -> AsyncIterator[AgentDriver]:
    """The benchmark agent with its connector on `database_url`, its web server up, an SDK client connected.

    `repo`: the checkout whose code the agent runs (another worktree, for a comparison in one run)."""
    migrate(database_url)
    port = free_port()
    catalog = workdir / "providers.toml"
    catalog.write_text(provider_catalog(provider))
    env = {
        **connector_env(port, database_url, generate_key("bench"), catalog),
        "PYTHONPATH": str(repo),
        "CONNECTOR_DATABASE__POOL_SIZE": "20",
        "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": CLIENT_ID,
        "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": CLIENT_SECRET,
        "CONNECTOR_RATE_LIMIT__ENABLED": "false",
        **PER_FLOW_USERS,
        **(extra_env or {}),
    }
    client = BenchClient()
    async with spawn_stdio_transport(PYTHON, "-m", "bench.agent", env=env, cwd=str(repo), stderr=None) as (
        reader,
        writer,
        process,
    ):
        conn = ClientSideConnection(client, writer, reader, use_unstable_protocol=True)  # type: ignore[arg-type]
        capabilities = ClientCapabilities(elicitation=ElicitationCapabilities(url=ElicitationUrlCapabilities()))
        await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=capabilities)
        await wait_until_up(f"http://127.0.0.1:{port}/healthz")
        try:
            yield AgentDriver(conn, client, pid=process.pid)
        finally:
            await conn.close()


@dataclass(frozen=True)
class Peers:
    """The mock provider and the baseline app, each in its own process."""

    provider: str
    baseline: BaselineApp
    provider_pid: int
    baseline_pid: int


@contextlib.asynccontextmanager
async def mock_provider_and_baseline() -> AsyncIterator[Peers]:
    provider_port, baseline_port = free_port(), free_port()
    provider = f"http://127.0.0.1:{provider_port}"
    async with children() as group:
        mock = group.start("-m", "bench.mock", str(provider_port), CLIENT_ID, CLIENT_SECRET)
        base = group.start("-m", "bench.baseline", str(baseline_port), provider, CLIENT_ID, CLIENT_SECRET)
        await wait_until_up(f"{provider}/api/user")
        await wait_until_up(f"http://127.0.0.1:{baseline_port}/login")
        yield Peers(provider, BaselineApp(f"http://127.0.0.1:{baseline_port}"), mock.pid, base.pid)


async def measured(flow: FlowFn, flows: int, concurrency: int, pids: dict[str, int]) -> tuple[Result, dict[str, float]]:
    """`run_flows`, and the CPU per completed flow (ms) each process in `pids` spent meanwhile."""
    before = {name: cpu_ms(pid) for name, pid in pids.items()}
    result = await run_flows(flow, flows, concurrency)
    done = max(result.flows, 1)
    return result, {name: (cpu_ms(pid) - before[name]) / done for name, pid in pids.items()}


# -- the measurements ----------------------------------------------------------------------------------------------
async def throughput(agent: AgentDriver, peers: Peers, *, flows: int, concurrency: int, rounds: int) -> list[str]:
    baseline = peers.baseline
    await run_flows(agent.flow, 20, concurrency)  # warm up both
    await run_flows(baseline.flow, 20, concurrency)
    assert agent.pid is not None
    driver = os.getpid()
    ours_pids = {"agent": agent.pid, "driver": driver, "mock provider": peers.provider_pid}
    theirs_pids = {"app": peers.baseline_pid, "driver": driver, "mock provider": peers.provider_pid}
    ours, theirs = [], []
    ours_cpu: dict[str, list[float]] = {name: [] for name in ours_pids}
    theirs_cpu: dict[str, list[float]] = {name: [] for name in theirs_pids}
    errors = 0
    for _ in range(rounds):  # alternate, so that a noisy neighbour hits both alike
        base, base_cpu = await measured(baseline.flow, flows, concurrency, theirs_pids)
        conn, conn_cpu = await measured(agent.flow, flows, concurrency, ours_pids)
        theirs.append(base.rate)
        ours.append(conn.rate)
        for name, ms in base_cpu.items():
            theirs_cpu[name].append(ms)
        for name, ms in conn_cpu.items():
            ours_cpu[name].append(ms)
        errors += base.errors + conn.errors
    ratio = median(ours) / median(theirs)
    ours_ms = {name: median(values) for name, values in ours_cpu.items()}
    theirs_ms = {name: median(values) for name, values in theirs_cpu.items()}
    ours_total, theirs_total = sum(ours_ms.values()), sum(theirs_ms.values())
    # On a machine whose cores the flows keep busy, flows/s goes as 1 / (CPU per flow, all processes): the ratio
    # the connector would reach if its own process cost what the baseline app costs, the rest of its flow as is.
    ceiling = theirs_total / (ours_total - ours_ms["agent"] + theirs_ms["app"])
    agent_ratio = ours_ms["agent"] / theirs_ms["app"]  # issue 32's goal: the connector's own CPU per flow
    return [
        f"| connect flows/s at concurrency {concurrency} (median of {rounds} alternating rounds of {flows}), every "
        "process of the flow on this machine's CPUs: the agent (ACP over stdio) or the baseline app, the driver "
        "playing the browsers and the ACP client, the mock provider "
        f"| connector {median(ours):.1f}, baseline {median(theirs):.1f} | **{ratio:.2f}x** "
        "| >= 0.5x (issue 32's in-process goal, the same as the agent's CPU per flow <= 2x below; here the "
        f"driver's and provider's work dilutes it) | {'met' if ratio >= 0.5 else 'NOT met'} |",
        *([f"| errors during the throughput rounds | {errors} | | 0 | {'met' if not errors else 'NOT met'} |"]),
        "| CPU per connect flow by process, ms (`/proc/<pid>/stat`, median of the rounds) "
        f"| connector: {_cpu_parts(ours_ms)} = {ours_total:.1f}; baseline: {_cpu_parts(theirs_ms)} = "
        f"{theirs_total:.1f} | {theirs_total / ours_total:.2f}x | | |",
        f"| connector CPU per flow against the careful baseline's: the agent process vs the baseline app "
        f"| {ours_ms['agent']:.1f} ms vs {theirs_ms['app']:.1f} ms | **{agent_ratio:.1f}x** | <= 2x "
        f"| {'met' if agent_ratio <= 2 else 'NOT met'} |",
        "| ... the ratio if the connector's process cost what the baseline app does (its driver and provider "
        f"work as measured) | agent {ours_ms['agent']:.1f} -> {theirs_ms['app']:.1f} ms | {ceiling:.2f}x | | |",
    ]


def _cpu_parts(ms: dict[str, float]) -> str:
    return " + ".join(f"{name} {value:.1f}" for name, value in ms.items())


async def latency(agent: AgentDriver, *, flows: int) -> list[str]:
    before = list(agent.client.flows.values())
    result = await run_flows(agent.flow, flows, 1)
    await asyncio.sleep(0.2)
    agent.settle(result, [f for f in agent.client.flows.values() if f not in before])
    times, after = result.latencies_ms, result.after_response_ms
    p50, p99, worst = percentile(times, 50), percentile(times, 99), max(times, default=float("nan"))
    return [
        f"| callback -> `elicitation/complete` on the ACP wire (stdio, official SDK client), {len(times)} sequential "
        f"flows: from the browser sending the callback (the code is redeemed at the provider meanwhile) "
        f"| p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {worst:.1f} ms | | p99 < 10 ms "
        f"| {'met' if p99 < 10 else 'NOT met'} |",
        f"| ... the same, from the callback's response reaching the browser (negative: the notification came first) "
        f"| p50 {percentile(after, 50):+.1f} ms, p99 {percentile(after, 99):+.1f} ms | | | |",
    ]


async def sweep(agent: AgentDriver, backend: str, levels: list[int], per_level: Callable[[int], int]) -> list[str]:
    rows = []
    for concurrency in levels:
        before = set(agent.client.flows)
        result = await run_flows(agent.flow, per_level(concurrency), concurrency)
        await asyncio.sleep(0.5)  # a completion still on its way is not lost
        agent.settle(result, [f for k, f in agent.client.flows.items() if k not in before])
        sample = f" ({'; '.join(result.error_samples)})" if result.error_samples else ""
        ok = result.errors == 0 and result.lost == 0 and result.duplicated == 0
        rows.append(
            f"| {backend}, concurrency {concurrency}: {result.flows} flows | {result.rate:.1f} flows/s; errors "
            f"{result.errors}{sample}, lost {result.lost}, duplicated {result.duplicated} | | 0 / 0 / 0 "
            f"| {'met' if ok else 'NOT met'} |"
        )
    return rows


async def main(quick: bool, throughput_only: bool = False) -> list[str]:
    flows, rounds = (40, 2) if quick else (150, 3)
    levels = [1, 8, 32] if quick else [1, 8, 32, 128]
    rows = [f"Measured on: {machine()}", "", "| measure | value | ratio | goal | |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        async with mock_provider_and_baseline() as peers:
            provider = peers.provider
            sqlite_url = f"sqlite+aiosqlite:///{tmp}/bench.db"
            async with connector_agent(provider, sqlite_url, Path(tmp)) as agent:
                rows += await throughput(agent, peers, flows=flows, concurrency=4, rounds=rounds)
                if throughput_only:
                    return rows
                rows += await latency(agent, flows=60 if quick else 300)
                rows += await sweep(agent, "SQLite", levels, lambda c: max(2 * c, 40))
            admin = os.environ.get("BENCH_POSTGRES_URL") or os.environ.get("CONNECTOR_TEST_POSTGRES_URL")
            if admin:
                async with postgres_database(admin) as pg_url, connector_agent(provider, pg_url, Path(tmp)) as agent:
                    await run_flows(agent.flow, 20, 4)
                    rows += await sweep(agent, "PostgreSQL", levels, lambda c: max(2 * c, 40))
            else:
                rows.append("| PostgreSQL sweep | skipped: set BENCH_POSTGRES_URL | | | |")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer flows and levels (a smoke run)")
    parser.add_argument(
        "--throughput-only", action="store_true", help="only the throughput and CPU-per-flow rows (SQLite)"
    )
    args = parser.parse_args()
    print("\n".join(asyncio.run(main(args.quick, args.throughput_only))))
