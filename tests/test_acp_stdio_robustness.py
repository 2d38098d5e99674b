"""ACP robustness over real stdio pipes: agents as subprocesses, the SDK's client as the peer (or as a process itself).

- a client killed mid-`elicitation/create`: the example agent exits 0 within 2 s of its stdin closing, and the
  elicitation row ends `cancelled` / `client_disconnected` with its audit event;
- malformed responses: the agent stays up and the next request works;
- the timeout/cancel table, as the client receives it.
The in-memory versions are in `test_acp_robustness.py` and `test_acp_cancellation.py`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from contextlib import suppress

import pytest

from service import AuthorizationStatus, ElicitationStatus
from service.store import Store
from service.testing import Answer, ScriptedClient

from .cancellation_table import TABLE, Row, client_for, run_row
from .stdio_support import REPO, StdioSetup, spawn_test_agent, stdio_setup
from .test_acp_robustness import MALFORMED, MARKER

__all__ = ["stdio_setup"]  # the fixture


async def test_client_killed_mid_create_agent_exits_cleanly_and_the_elicitation_ends(stdio_setup: StdioSetup) -> None:
    """Two processes joined by pipes: the example agent, and a client process that is killed with SIGKILL."""
    to_agent_r, to_agent_w = os.pipe()
    from_agent_r, from_agent_w = os.pipe()
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.github_agent",
        stdin=to_agent_r,
        stdout=from_agent_w,
        stderr=asyncio.subprocess.PIPE,
        env=stdio_setup.env,
        cwd=REPO,
    )
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.stdio_client",
        stdin=from_agent_r,
        stdout=to_agent_w,
        stderr=asyncio.subprocess.PIPE,
        env=stdio_setup.env,
        cwd=REPO,
    )
    for fd in (to_agent_r, to_agent_w, from_agent_r, from_agent_w):
        os.close(fd)  # only the two processes hold the pipes now
    store = Store.from_url(stdio_setup.db_url)
    try:
        assert client.stderr is not None and agent.stderr is not None
        line = await asyncio.wait_for(client.stderr.readline(), 60)
        assert line.startswith(b"elicitation "), line
        elicitation_id = line.split()[1].decode()
        record = await store.elicitations.get(elicitation_id)
        assert record is not None and record.status is ElicitationStatus.PENDING

        client.send_signal(signal.SIGKILL)  # the client dies mid-create: the agent's stdin closes
        await client.wait()
        returncode = await asyncio.wait_for(agent.wait(), 2)
        stderr = (await agent.stderr.read()).decode(errors="replace")
        assert returncode == 0, stderr
        assert "Traceback" not in stderr

        record = await store.elicitations.get(elicitation_id)
        assert record is not None and record.status is ElicitationStatus.CANCELLED
        assert record.failure_reason == "client_disconnected"
        events = [e.event for e in await store.audit.list(elicitation_id=elicitation_id)]
        assert events[-1] == "client_disconnected"
        assert AuthorizationStatus.DISCONNECTED.value == "disconnected"
    finally:
        for process in (client, agent):
            if process.returncode is None:
                with suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        await store.close()


def agent_texts(client: ScriptedClient) -> list[str]:
    return [
        m["params"]["update"]["content"]["text"]
        for m in client.received("session/update")
        if m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


async def test_malformed_responses_over_stdio_leave_the_agent_up(stdio_setup: StdioSetup) -> None:
    shapes = sorted(MALFORMED)
    script = [answer for shape in shapes for answer in (Answer.raw(MALFORMED[shape]), Answer.decline())]
    client = ScriptedClient(script)
    async with spawn_test_agent(client, stdio_setup) as agent:
        await asyncio.wait_for(client.initialize(agent.conn), 30)
        session = await asyncio.wait_for(agent.conn.new_session(cwd="/"), 10)
        for _ in range(2 * len(shapes)):
            result = await asyncio.wait_for(agent.conn.prompt(session_id=session.session_id, prompt=[]), 30)
            assert result.stop_reason == "end_turn"
        assert agent.process.returncode is None
    texts = agent_texts(client)
    assert len(texts) == 2 * len(shapes)
    for shape, malformed, declined in zip(shapes, texts[::2], texts[1::2], strict=True):
        assert "malformed_response" in malformed, (shape, malformed)
        assert "declined" in declined, (shape, declined)
    assert agent.process.returncode == 0
    assert MARKER not in agent.stderr() and "Traceback" not in agent.stderr()


@pytest.mark.parametrize("row", TABLE, ids=[row.id for row in TABLE])
async def test_early_stop_over_stdio(stdio_setup: StdioSetup, row: Row) -> None:
    env = dict(row.settings)
    if row.agent_deadline is not None:
        env["TEST_AGENT_DEADLINE"] = str(row.agent_deadline)
    client = client_for(row)
    store = Store.from_url(stdio_setup.db_url)

    async def status_of(elicitation_id: str) -> ElicitationStatus | None:
        record = await store.elicitations.get(elicitation_id)
        return record.status if record is not None else None

    try:
        async with spawn_test_agent(client, stdio_setup, **env) as agent:
            await asyncio.wait_for(client.initialize(agent.conn), 30)
            session = await asyncio.wait_for(agent.conn.new_session(cwd="/"), 10)
            await run_row(row, client, agent.conn, session.session_id, status_of)
        assert agent.process.returncode == 0, agent.stderr()
    finally:
        await store.close()
