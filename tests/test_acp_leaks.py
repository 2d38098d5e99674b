"""Nothing is kept for a connection once it has ended: 10,000 connections and sessions, then the tables are empty."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from acp import PROTOCOL_VERSION
from acp.agent.connection import AgentSideConnection
from acp.client.connection import ClientSideConnection

from service import AuthorizationStatus, RequestScope
from service.testing import memory_transport_pair
from service.util.locks import KeyedLocks

from .acp_peers import URL_CAPABLE, ConnectorAgent, RecordingClient, connect, eventually, prompt_text
from .conftest import Deployment

CONNECTIONS = 10_000
WITH_AN_ELICITATION = 100  # every 100th connection also runs one elicitation (declined) in its session


@pytest.mark.duration(12)
async def test_ten_thousand_connections_and_sessions_leave_the_tables_empty(deployment: Deployment) -> None:
    connector = deployment.connector
    gone: list[weakref.ref[AgentSideConnection]] = []
    declined = 0
    for i in range(CONNECTIONS):
        agent = ConnectorAgent(connector, deployment.local_user)  # attaches in on_connect, with a state listener
        agent_end, client_end = memory_transport_pair()
        agent_conn = AgentSideConnection(agent, agent_end, use_unstable_protocol=True)
        client = RecordingClient(answer="decline")
        client_conn = ClientSideConnection(client, client_end, use_unstable_protocol=True)
        await client_conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=URL_CAPABLE)
        session = await client_conn.new_session(cwd="/")
        if i % WITH_AN_ELICITATION == 0:
            await asyncio.wait_for(client_conn.prompt(session_id=session.session_id, prompt=prompt_text("go")), 10)
            declined += [o.status for o in agent.outcomes] == [AuthorizationStatus.DECLINED]
        await client_conn.cancel(session_id=session.session_id)  # per-session state on the connector's side
        await client_conn.close()
        await agent_conn.close()
        gone.append(weakref.ref(agent_conn))
    del agent, agent_conn, client, client_conn  # the test's own references to the last connection
    assert declined == CONNECTIONS // WITH_AN_ELICITATION

    assert connector.runtime.acp.tables() == {
        "links": 0,
        "deliveries": 0,
        "blocked_sessions": 0,
        "state_listeners": 0,
    }

    async def all_freed() -> bool:
        gc.collect()
        return all(ref() is None for ref in gone)

    # Nothing the connector keeps holds a connection (the last close may still be finishing: wait for it).
    await eventually(all_freed, "every closed connection is freed")


@pytest.mark.duration(3)
async def test_a_connection_keeps_nothing_of_the_awaited_calls_that_ended_on_it(deployment: Deployment) -> None:
    """Calls awaiting the browser on one connection that stays open: each is kept to be woken if the connection
    ends, and nothing of them is kept once they ended."""
    connector, user = deployment.connector, deployment.local_user
    wire = await connect(connector, user, RecordingClient(answer="accept"))
    link = connector.attach(wire.agent_conn)

    def ask(n: int) -> asyncio.Task[object]:
        call = connector.request_authorization(
            wire.agent_conn, user=user, provider="github", scopes=[f"scope-{n}"], scope=RequestScope(n)
        )
        return asyncio.create_task(call)

    calls = [ask(n) for n in range(40)]

    async def all_waiting() -> bool:
        return link.close_waiters == len(calls)

    await eventually(all_waiting, "every call awaits the browser")
    for call in calls[:30]:
        call.cancel()
    await asyncio.gather(*calls[:30], return_exceptions=True)
    assert link.close_waiters <= 2 * 10  # the ended ones go in bulk: never more than the ones waiting again
    for call in calls[30:]:
        call.cancel()
    await asyncio.gather(*calls[30:], return_exceptions=True)
    assert link.close_waiters == 0
    assert connector.runtime.bus.waiting() == 0
    await wire.close()


async def test_keyed_locks_exist_only_while_used() -> None:
    locks = KeyedLocks[str]()
    order: list[str] = []

    async def use(key: str, name: str, hold: asyncio.Event) -> None:
        async with locks.hold(key):
            order.append(f"{name} in")
            await hold.wait()
            order.append(f"{name} out")

    release_a, release_b, release_c = asyncio.Event(), asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(use("grant-1", "a", release_a))
    second = asyncio.create_task(use("grant-1", "b", release_b))  # waits for a
    other = asyncio.create_task(use("grant-2", "c", release_c))  # another key: not blocked
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order == ["a in", "c in"] and len(locks) == 2
    release_a.set()
    release_c.set()
    await asyncio.gather(first, other)
    await asyncio.sleep(0)
    assert order[-1] == "b in" and len(locks) == 1  # grant-1's lock lives on while b holds it
    release_b.set()
    await second
    assert len(locks) == 0

    cancelled = asyncio.create_task(use("grant-3", "d", asyncio.Event()))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert len(locks) == 0  # also after a holder was cancelled
