"""The benchmark's ACP agent: one stdio agent with the connector embedded, as an agent author would run it.

Every prompt asks the connector for `github` access with one scope, the prompt's text, for the user of that name
(bench/driver.py: the driver makes it unique per flow and the trusted_header verifier believes the driver's browser,
so no stored grant ever covers it), and ends the turn when the call returns,
with the outcome's status as its text. The connector's settings come from the CONNECTOR_* environment the driver
sets; its connect pages are served on loopback in this process.

    python -m bench.agent        (started by bench/flow.py; stdout carries ACP, logs go to stderr)

Once its connector has started, the agent freezes what the start built (`gc.collect()`, `gc.freeze()`: out of every
later collection's walk), as docs/embedded.md advises an agent that embeds the connector; BENCH_GC_FREEZE=0 leaves
the collector as it is (bench/agent_ab.py puts the two side by side). The baseline app does the same.

With BENCH_PROFILE=<path> in its environment the agent runs under cProfile with a CPU clock (this thread's CPU time:
waiting is not counted, SQLite's own thread is not charged to whatever the event loop runs meanwhile) and writes the
stats to <path> when it exits, e.g. `BENCH_PROFILE=/tmp/agent.prof python -m bench.flow --throughput-only`, then
`python -c "import pstats; pstats.Stats('/tmp/agent.prof').sort_stats('tottime').print_stats(40)"`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, run_agent, update_agent_message_text
from acp.interfaces import Client
from acp.schema import AgentCapabilities, InitializeResponse, NewSessionResponse, PromptResponse

from bench import trace
from bench.driver import USER_ISSUER
from bench.gcprobe import GcProbe
from bench.memory import MemoryProbe
from service import Connector, Identity, SessionScope, load_settings


class BenchAgent:
    def __init__(self, connector: Connector, issuer: str) -> None:
        self.connector = connector
        self.issuer = issuer
        self.conn: Client | None = None
        self.capabilities: Any = None
        self.sessions = 0

    def on_connect(self, conn: Client) -> None:
        self.conn = conn
        self.connector.attach(conn)

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, **kwargs: Any) -> Any:
        self.capabilities = client_capabilities
        return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        self.sessions += 1
        return NewSessionResponse(session_id=f"s{self.sessions}")

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        assert self.conn is not None
        scope_name = prompt[0].text
        outcome = await self.connector.request_authorization(
            self.conn,
            self.capabilities,
            user=Identity(self.issuer, scope_name),
            provider="github",
            scopes=[scope_name],
            scope=SessionScope(session_id, f"call-{scope_name}"),
        )
        await self.conn.session_update(session_id, update_agent_message_text(outcome.status.value))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


async def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if probe_dir := os.environ.get("BENCH_MEMORY_DIR"):  # bench/soak.py reads this process's memory through it
        MemoryProbe(Path(probe_dir)).install()
    if trace_to := os.environ.get("BENCH_TRACE"):  # a path: the completion's path marked there (bench/trace.py)
        trace.install(trace_to)
    if profile_path := os.environ.get("BENCH_PATH_PROFILE"):  # a path: the callback's path profiled there
        from bench import path_profile  # (bench/path_profile.py)

        path_profile.install(profile_path, os.environ.get("BENCH_PATH_PROFILE_FROM", "callback"))
    if gc_log := os.environ.get("BENCH_GC_LOG"):  # a path: every garbage collection logged there (bench/gcprobe.py)
        GcProbe(Path(gc_log)).install()
    connector = Connector.from_settings(load_settings(None))
    await connector.start()
    if os.environ.get("BENCH_GC_FREEZE", "1") != "0":  # as docs/embedded.md advises a long-running agent
        gc.collect()
        gc.freeze()
    web = asyncio.create_task(connector.serve())
    try:
        await run_agent(BenchAgent(connector, USER_ISSUER), use_unstable_protocol=True)  # type: ignore[arg-type]
    finally:
        web.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await web
        await connector.close()


if __name__ == "__main__":
    profile_to = os.environ.get("BENCH_PROFILE")  # a path: profile this agent (cProfile) and write the stats there
    if profile_to:
        import cProfile
        import time

        profiler = cProfile.Profile(time.thread_time)
        try:
            profiler.runcall(asyncio.run, main())
        finally:
            profiler.dump_stats(profile_to)
    else:
        asyncio.run(main())
