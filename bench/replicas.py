"""Two replicas on one PostgreSQL database, side by side with one process, in one run:

  latency    callback -> `elicitation/complete` on the ACP wire: the time from the browser sending the provider's
             redirect to `/callback/...` to the ACP client receiving `elicitation/complete`. Single process: the
             agent process (the GitHub example agent, the official SDK client over stdio) also serves the browser.
             Two replicas: the browser uses replica B (`acp-connector serve`) and the completion crosses to the
             agent's process A over LISTEN/NOTIFY. Goal: p99 < 50 ms across replicas. Both processes run under
             `bench/trace.py`, which timestamps each flow's points on the way (callback at B, the provider's token
             call, the commit, the NOTIFY, the wake-up at A, A's read of the event log, the claim, the push on the
             ACP wire): the table of segments and the slowest ten flows, each with the segment that made it slow.
  refresh    1,000 concurrent uses of an expired grant, 500 in each of two replica processes
             (`tests/replica_worker.py`), against the mock provider rotating refresh tokens: refreshes per round
             (goal exactly 1), failures (goal 0), API calls (1,000: no request was sent with a dead token).

    .venv/bin/python -m bench.replicas [--flows 300] [--rounds 5] [--quick]

Needs a PostgreSQL server: BENCH_POSTGRES_URL or CONNECTOR_TEST_POSTGRES_URL (a scratch database is created and
dropped). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from acp import text_block
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.harness import free_port, percentile, postgres_database
from service import Connector, Identity, load_settings
from service.core.handles import grant_aad
from service.core.records import TokenSet
from service.store import migrate
from service.testing import MockOAuthProvider, ScriptedBrowser, ScriptedClient, spawn_agent
from service.testing.acp_client import SpawnedAgent
from service.vault import generate_key

REPO = Path(__file__).resolve().parents[1]
USER = Identity("https://login.example.com", "bench-user")
USES_PER_REPLICA = 500


class TimedClient(ScriptedClient):
    """The official SDK's client side, noting when each `elicitation/complete` arrives."""

    def __init__(self) -> None:
        super().__init__("accept")
        self.completed_at: dict[str, tuple[float, float]] = {}  # (perf_counter, wall clock)

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        self.completed_at.setdefault(elicitation_id, (time.perf_counter(), time.time()))
        await super().complete_elicitation(elicitation_id, **kwargs)


@asynccontextmanager
async def replica_b(env: dict[str, str]) -> AsyncIterator[tuple[str, int]]:
    """`acp-connector serve` on its own port (traced); its URL and process id once ready."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process_env = {
        **os.environ,
        **env,
        "CONNECTOR_PUBLIC_BASE_URL": url,
        "CONNECTOR_SERVER__PORT": str(port),
        "PYTHONPATH": str(REPO),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.trace",
        "-m",
        "service.cli",
        "serve",
        cwd=REPO,
        env=process_env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{url}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                raise SystemExit("replica B did not become ready")
        yield url, proc.pid
    finally:
        proc.terminate()
        await proc.wait()


Timing = tuple[float, float]  # seconds: from the callback sent, and from the completion stored, to complete received


@dataclass
class Flow:
    timing: Timing
    sent: float  # wall clock: the browser sent the callback
    received: float  # wall clock: the client received `elicitation/complete`


@dataclass
class Run:
    flows: list[Flow]
    agent_pid: int


async def latencies(env: dict[str, str], database_url: str, public_url: str | None, flows: int) -> Run:
    """`flows` connect flows through the GitHub example agent, timed.

    `public_url` None: the agent's own process serves the browser; else the browser uses that replica."""
    client = TimedClient()
    port = free_port()
    agent_env = {
        **env,
        "CONNECTOR_PUBLIC_BASE_URL": public_url or f"http://127.0.0.1:{port}",
        "CONNECTOR_SERVER__PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }
    engine = create_async_engine(database_url, poolclass=NullPool)
    results: list[Flow] = []
    program = ("-m", "bench.trace", "-m", "examples.github_agent")
    try:
        async with spawn_agent(client, sys.executable, *program, env=agent_env, cwd=REPO) as a:
            pid = a.process.pid
            await asyncio.wait_for(client.initialize(a.conn), 60)
            for _ in range(flows):
                results.append(await one_flow(client, a, engine))
            warnings = [line for line in a.stderr().splitlines() if '"level": "warning"' in line]
            if warnings:
                print(f"agent warnings ({len(warnings)}):", *warnings[:10], sep="\n", file=sys.stderr)
    finally:
        await engine.dispose()
    return Run(results, pid)


async def one_flow(client: TimedClient, agent: SpawnedAgent, engine: Any) -> Flow:
    async with engine.begin() as conn:  # a new elicitation each time (the last flow's grant stays for later)
        await conn.execute(text("DELETE FROM grants"))
    session_id = (await agent.conn.new_session(cwd=str(REPO))).session_id
    prompt = asyncio.create_task(agent.conn.prompt(session_id=session_id, prompt=[text_block("list my repos")]))
    elicitation = await client.next_consented(within=30)
    sent_callback: list[tuple[float, float]] = []

    async def note_callback(request: httpx.Request) -> None:
        if request.url.path.startswith("/callback/"):
            sent_callback.append((time.perf_counter(), time.time()))

    async with ScriptedBrowser() as browser:
        browser.client.event_hooks["request"].append(note_callback)
        final = await browser.authorize(elicitation.url)
        if final.status_code != 200:
            raise SystemExit(f"the browser flow failed: {final.status_code}")
    result = await asyncio.wait_for(prompt, 30)
    if result.stop_reason != "end_turn" or elicitation.elicitation_id not in client.completed_at:
        raise SystemExit(f"the prompt did not complete: {result.stop_reason}\n{agent.stderr()[-2000:]}")
    received, received_wall = client.completed_at[elicitation.elicitation_id]
    async with engine.connect() as conn:  # the completion's time as the replica that stored it wrote it
        stored = await conn.scalar(
            text("SELECT updated_at FROM elicitations WHERE id = :id"), {"id": elicitation.elicitation_id}
        )
    timing = (received - sent_callback[0][0], received_wall - stored.timestamp())
    return Flow(timing, sent_callback[0][1], received_wall)


async def refresh_rounds(env: dict[str, str], provider: MockOAuthProvider, rounds: int) -> list[dict[str, int]]:
    config = Path(env["CONNECTOR_CONFIG"])
    connector = Connector.from_settings(load_settings(config, env=env))
    await connector.start()
    try:
        rows = []
        for _ in range(rounds):
            await expire(connector, provider)
            refreshes = count_refreshes(provider)
            calls = len(provider.api_calls)
            results = await run_workers(env, 2, USES_PER_REPLICA)
            failures = sum(
                sum(r["errors"].values()) + sum(v for k, v in r["statuses"].items() if k != "200") for r in results
            )
            rows.append(
                {
                    "refreshes": count_refreshes(provider) - refreshes,
                    "failures": failures,
                    "api_calls": len(provider.api_calls) - calls,
                }
            )
        return rows
    finally:
        await connector.close()


def count_refreshes(provider: MockOAuthProvider) -> int:
    return sum(1 for r in provider.token_requests if r.get("grant_type") == "refresh_token")


async def expire(connector: Connector, provider: MockOAuthProvider) -> None:
    """The user's grant expired everywhere: its stored expiry is past, and the provider refuses its token."""
    runtime = connector.runtime
    (grant,) = await runtime.store.grants.find(USER, "github")
    aad = grant_aad(USER.issuer, USER.subject, "github", grant.provider_account_id)
    tokens = runtime.tokens.decrypt(grant)
    past = datetime.now(UTC) - timedelta(minutes=5)
    key_id, blob = runtime.vault.encrypt_json({**tokens.to_json(), "expires_at": past.timestamp()}, aad=aad)
    await runtime.store.grants.update_tokens(
        grant.id,
        token_key_id=key_id,
        token_ciphertext=blob,
        token_expires_at=past,
        scopes=grant.scopes,
        now=past,
        replacing=grant.token_ciphertext,
    )
    provider.expire_access_tokens()
    assert TokenSet.from_json(runtime.vault.decrypt_json(key_id, blob, aad=aad)).expires_at == past.timestamp()


async def run_workers(env: dict[str, str], count: int, uses: int) -> list[dict[str, dict[str, int]]]:
    process_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    args = ("-m", "tests.replica_worker", str(uses), USER.issuer, USER.subject)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            cwd=REPO,
            env=process_env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    for proc in procs:
        assert proc.stdout is not None
        if (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() != b"ready":
            raise SystemExit("a replica worker did not start")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    outputs = await asyncio.gather(*(proc.communicate() for proc in procs))
    return [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]


Mark = tuple[float, str, int]  # wall clock, point, process id (bench/trace.py)
# The points a completion passes, in order: (point, "a" the agent's process / "b" the browser's replica).
ONE_PROCESS = [("callback", "a"), ("token.start", "a"), ("token.end", "a"), ("commit", "a"), ("claim", "a")]
ONE_PROCESS += [("push.start", "a"), ("push.end", "a")]
ACROSS = [("callback", "b"), ("token.start", "b"), ("token.end", "b"), ("commit", "b"), ("notify.start", "b")]
# (No "notify.end": the notifications may reach A before B's NOTIFY statement has returned.)
ACROSS += [("wake", "a"), ("feed", "a"), ("claim", "a"), ("push.start", "a"), ("push.end", "a")]
SEGMENTS = {  # the segment ending at a point, named for what happens in it
    "callback": "browser -> handler (HTTP, ASGI)",
    "token.start": "handler: state, flow claim",
    "token.end": "provider token call",
    "commit": "store grant, complete (commit)",
    "notify.start": "commit -> NOTIFY sent",
    "wake": "NOTIFY sent -> heard at A",
    "feed": "read of the event log at A",
    "claim": "-> telling claimed (update)",
    "push.start": "claim -> push",
    "push.end": "push on the ACP wire",
    "received": "wire -> client received",
}


def read_trace(path: Path) -> list[Mark]:
    marks = []
    for line in path.read_text().splitlines():
        at, point, pid = line.split()[:3]
        marks.append((float(at), point, int(pid)))
    return sorted(marks)


def segments(flow: Flow, marks: list[Mark], chain: list[tuple[str, str]], pids: dict[str, int]) -> dict[str, float]:
    """Milliseconds of each segment of one flow: from each point to the next one found after it."""
    inside = [m for m in marks if flow.sent <= m[0] <= flow.received + 0.001]
    out: dict[str, float] = {}
    last = flow.sent
    for point, where in chain:
        found = next((at for at, p, pid in inside if p == point and pid == pids[where] and at >= last), None)
        if found is None:
            continue
        out[point] = (found - last) * 1000
        last = found
    out["received"] = (flow.received - last) * 1000
    return out


def trace_tables(label: str, run: Run, marks: list[Mark], chain: list[tuple[str, str]], pids: dict[str, int]) -> None:
    per_flow = [segments(f, marks, chain, pids) for f in run.flows]
    print(f"Segments of callback -> `elicitation/complete`, {label} (ms, {len(per_flow)} flows):\n")
    print("| segment | p50 | p90 | p99 | max | share of the total at p50 |\n|---|---:|---:|---:|---:|---:|")
    total = sum(percentile([f.get(p, 0.0) for f in per_flow], 50) for p, _ in [*chain, ("received", "")])
    for point, _ in [*chain, ("received", "")]:
        values = [f.get(point, 0.0) for f in per_flow]
        print(
            f"| {SEGMENTS[point]} | {percentile(values, 50):.1f} | {percentile(values, 90):.1f} | "
            f"{percentile(values, 99):.1f} | {max(values):.1f} | {percentile(values, 50) / total:.0%} |"
        )
    missing = sum(1 for f in per_flow if len(f) < len(chain) + 1)
    if missing:
        print(f"\n({missing} flows lacked a point: its time is in the next segment.)")
    slowest = sorted(range(len(per_flow)), key=lambda i: -run.flows[i].timing[0])[:10]
    print(f"\nThe slowest ten, {label}: total ms, and the segments over their p90 (ms):\n")
    print("| flow | total | slowest segment | other segments over their p90 |\n|---|---:|---|---|")
    p90 = {p: percentile([f.get(p, 0.0) for f in per_flow], 90) for p, _ in [*chain, ("received", "")]}
    for i in slowest:
        parts = per_flow[i]
        worst = max(parts, key=lambda p: parts[p] - p90[p])
        others = ", ".join(
            f"{SEGMENTS[p]} {v:.0f}"
            for p, v in sorted(parts.items(), key=lambda kv: -kv[1])
            if p != worst and v > p90[p]
        )
        print(
            f"| {i + 1} | {run.flows[i].timing[0] * 1000:.1f} | {SEGMENTS[worst]} {parts[worst]:.0f} "
            f"(p90 {p90[worst]:.0f}) | {others or '-'} |"
        )
    print()


def row(label: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"| {label} | {len(ms)} | {percentile(ms, 50):.1f} | {percentile(ms, 90):.1f} | "
        f"{percentile(ms, 99):.1f} | {max(ms):.1f} |"
    )


async def main(flows: int, rounds: int) -> None:
    admin_url = os.environ.get("BENCH_POSTGRES_URL") or os.environ.get("CONNECTOR_TEST_POSTGRES_URL")
    if not admin_url:
        print("Skipped: needs PostgreSQL (BENCH_POSTGRES_URL, e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test).")
        return
    provider = MockOAuthProvider(refresh_delay=0.05)
    with tempfile.TemporaryDirectory() as tmp:
        async with provider.serve_http(), postgres_database(admin_url, prefix="connector_bench") as database_url:
            migrate(database_url)
            catalog = Path(tmp) / "providers.toml"
            entry = provider.catalog_entry()
            catalog.write_text("[github]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in entry.items()) + "\n")
            config = Path(tmp) / "connector.toml"
            config.write_text("")
            env = {
                "CONNECTOR_CONFIG": str(config),
                "CONNECTOR_DATABASE__URL": database_url,
                "CONNECTOR_VAULT__KEYS": generate_key("k1"),
                "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
                "CONNECTOR_IDENTITY__LOCAL__ISSUER": USER.issuer,
                "CONNECTOR_IDENTITY__LOCAL__SUBJECT": USER.subject,
                "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": provider.client_id,
                "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": provider.client_secret,
                "CONNECTOR_RATE_LIMIT__ENABLED": "false",
                "CONNECTOR_LOG_FORMAT": "json",
            }
            trace = Path(tmp) / "trace.log"
            env["BENCH_TRACE"] = str(trace)
            single_run = await latencies(env, database_url, None, flows)
            async with replica_b(env) as (b_url, b_pid):
                across_run = await latencies(env, database_url, b_url, flows)
            marks = read_trace(trace)
            single = [f.timing for f in single_run.flows]
            across = [f.timing for f in across_run.flows]
            # The refresh rounds use the grant the last flow stored.
            refreshed = await refresh_rounds(env, provider, rounds)

    print(
        f"Measured on {platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{datetime.now(UTC):%Y-%m-%d}.\n"
    )
    print("Callback -> `elicitation/complete` on the ACP wire (ms):\n")
    print("| browser at | flows | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|")
    print(row("the agent's own process (one process)", [t[0] for t in single]))
    print(row("replica B; the connection on replica A", [t[0] for t in across]))
    ratio = percentile([t[0] for t in across], 99) / percentile([t[0] for t in single], 99)
    print(f"\nRatio of the p99s (two replicas / one process): {ratio:.2f}\n")
    print("Of that, from the completion stored (the callback's transaction) to `elicitation/complete` received (ms):\n")
    print("| browser at | flows | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|")
    print(row("the agent's own process (one process)", [t[1] for t in single]))
    print(row("replica B; the connection on replica A", [t[1] for t in across]))
    print()
    trace_tables("one process", single_run, marks, ONE_PROCESS, {"a": single_run.agent_pid})
    trace_tables("two replicas", across_run, marks, ACROSS, {"a": across_run.agent_pid, "b": b_pid})
    load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Load average at the end: {load_average}\n")
    if not refreshed:
        return
    print(f"Refreshes per {2 * USES_PER_REPLICA} concurrent uses of an expired grant, two replicas:\n")
    print("| round | refreshes (goal 1) | failures (goal 0) | API calls (1,000: none with a dead token) |")
    print("|---|---|---|---|")
    for index, values in enumerate(refreshed, 1):
        print(f"| {index} | {values['refreshes']} | {values['failures']} | {values['api_calls']} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flows", type=int, default=300, help="connect flows per configuration")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of 1,000 concurrent expired uses")
    parser.add_argument("--quick", action="store_true", help="20 flows and 2 rounds (a smoke run)")
    options = parser.parse_args()
    asyncio.run(main(20 if options.quick else options.flows, 2 if options.quick else options.rounds))
