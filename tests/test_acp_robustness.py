"""A misbehaving or vanishing client, driven by the SDK's own client (`ScriptedClient`) over the in-memory transport.

Malformed responses, unknown actions, refusals with a reason, a client that goes away mid-request, `attach()`
before and after `initialize`, and the SDK version the adapter accepts. The stdio subprocess versions of the same
rules are in `test_acp_stdio_robustness.py`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
from acp.agent.connection import AgentSideConnection

from service import (
    AcpSdkUnsupported,
    AuthorizationStatus,
    ClientNotInitialized,
    ElicitationStatus,
    RequestScope,
    SessionScope,
)
from service.acp import check_sdk_version
from service.testing import Answer, ScriptedClient, memory_transport_pair

from .acp_peers import ConnectorAgent, eventually, scripted_peer, status_is
from .conftest import Deployment

MARKER = "payload-marker-7f3a"  # a value the client sends that must never reach a log line

MALFORMED: dict[str, Callable[[Any], dict[str, Any]]] = {
    "error-not-an-object": lambda rid: {"jsonrpc": "2.0", "id": rid, "error": MARKER},
    "error-code-not-an-integer": lambda rid: {"jsonrpc": "2.0", "id": rid, "error": {"code": MARKER, "message": "x"}},
    "id-is-a-list": lambda rid: {"jsonrpc": "2.0", "id": [rid], "result": {"action": "accept", "x": MARKER}},
    "id-never-sent": lambda rid: {"jsonrpc": "2.0", "id": rid + 1000, "result": {"action": "accept", "x": MARKER}},
    "id-is-a-string-of-ours": lambda rid: {"jsonrpc": "2.0", "id": str(rid), "result": {"action": MARKER}},
    "id-is-null": lambda rid: {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": MARKER}},
    "result-and-error": lambda rid: {
        "jsonrpc": "2.0",
        "id": rid,
        "result": {"action": "accept"},
        "error": {"code": 1, "message": MARKER},
    },
    "neither-result-nor-error": lambda rid: {"jsonrpc": "2.0", "id": rid, "x": MARKER},
    "result-not-an-object": lambda rid: {"jsonrpc": "2.0", "id": rid, "result": MARKER},
    "no-jsonrpc-version": lambda rid: {"id": rid, "result": {"action": "accept", "x": MARKER}},
}
UNATTRIBUTABLE = {"id-is-a-list", "id-never-sent", "id-is-a-string-of-ours", "id-is-null"}


async def audit_events(deployment: Deployment, elicitation_id: str) -> list[Any]:
    return await deployment.connector.runtime.store.audit.list(elicitation_id=elicitation_id)


@pytest.mark.parametrize("shape", sorted(MALFORMED))
async def test_malformed_response_ends_the_request_with_an_error_and_the_agent_stays_up(
    deployment: Deployment, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = ScriptedClient([Answer.raw(MALFORMED[shape]), "decline"])
    async with scripted_peer(deployment.connector, deployment.local_user, client) as wire:
        first = await asyncio.wait_for(wire.prompt(), 10)
        assert first.stop_reason == "end_turn"
        outcome = wire.agent.outcomes[0]
        assert outcome.status is AuthorizationStatus.CLIENT_ERROR
        assert outcome.reason is not None and outcome.reason.startswith("malformed_response: ")
        record = await deployment.connector.elicitation(outcome.elicitation_id or "")
        assert record is not None and record.status is ElicitationStatus.FAILED
        creates = client.received("elicitation/create")
        cancels = [m["params"] for m in client.received("$/cancel_request")]
        # A response that names no request of ours: the request it was meant for is withdrawn as well.
        assert cancels == ([{"requestId": creates[0]["id"]}] if shape in UNATTRIBUTABLE else [])

        # The connection still works: the next request is answered normally.
        second = await asyncio.wait_for(wire.prompt(), 10)
        assert second.stop_reason == "end_turn"
        assert wire.agent.outcomes[1].status is AuthorizationStatus.DECLINED
        assert len(client.received("elicitation/create")) == 2
    assert MARKER not in caplog.text  # logged by shape, never by value
    assert any("malformed" in r.getMessage() or "matches no request" in r.getMessage() for r in caplog.records)


async def test_unknown_action_is_a_client_error_naming_the_action(deployment: Deployment) -> None:
    long_action = "maybe\u202e" + "x" * 500  # a bidi override and far too long
    client = ScriptedClient(
        [
            Answer.raw(lambda rid: {"jsonrpc": "2.0", "id": rid, "result": {"action": "maybe"}}),
            Answer.raw(lambda rid: {"jsonrpc": "2.0", "id": rid, "result": {"action": long_action}}),
        ]
    )
    async with scripted_peer(deployment.connector, deployment.local_user, client) as wire:
        await asyncio.wait_for(wire.prompt(), 10)
        await asyncio.wait_for(wire.prompt(), 10)
    plain, long = wire.agent.outcomes
    assert plain.status is AuthorizationStatus.CLIENT_ERROR and plain.reason == "unknown_action: maybe"
    assert "unknown_action: maybe" in plain.describe() and "None" not in plain.describe()
    assert long.status is AuthorizationStatus.CLIENT_ERROR and long.reason is not None
    assert long.reason.startswith("unknown_action: maybe ") and "\u202e" not in long.reason
    assert len(long.reason) <= len("unknown_action: ") + 64
    events = await audit_events(deployment, plain.elicitation_id or "")
    assert [e.detail.get("reason") for e in events if e.event == "client_error"] == ["unknown_action: maybe"]


async def test_a_clients_refusal_keeps_its_reason_and_reads_differently_from_a_persons_cancel(
    deployment: Deployment,
) -> None:
    reason = "elicitation mode is not supported"
    client = ScriptedClient([Answer.cancel(reason), Answer.cancel()])
    async with scripted_peer(deployment.connector, deployment.local_user, client) as wire:
        await asyncio.wait_for(wire.prompt(), 10)
        await asyncio.wait_for(wire.prompt(), 10)
    assert client.sent("elicitation/create") == []  # (the client sends no requests of that name)
    refusal, dismissal = wire.agent.outcomes
    assert client.responses_to(client.elicitations[0].request_id)[0]["result"] == {
        "action": "cancel",
        "_meta": {"message": reason},
    }

    assert refusal.status is AuthorizationStatus.REFUSED
    assert refusal.client_message == reason and reason in refusal.describe()
    assert dismissal.status is AuthorizationStatus.CANCELLED and dismissal.client_message is None
    assert reason not in dismissal.describe() and refusal.describe() != dismissal.describe()

    refused_record = await deployment.connector.elicitation(refusal.elicitation_id or "")
    assert refused_record is not None and refused_record.status is ElicitationStatus.CANCELLED
    assert refused_record.failure_reason == f"client_refused: {reason}"
    # The outcome read back from the row (as the /v1 API would) says the same.
    reread = await deployment.connector.runtime.elicitations.outcome(refused_record)
    assert reread.status is AuthorizationStatus.REFUSED and reread.client_message == reason

    refused_events = await audit_events(deployment, refusal.elicitation_id or "")
    dismissed_events = await audit_events(deployment, dismissal.elicitation_id or "")
    assert [(e.event, e.detail.get("client_message")) for e in refused_events if e.event != "created"] == [
        ("refused", reason)
    ]
    assert [(e.event, e.detail.get("reason")) for e in dismissed_events if e.event != "created"] == [
        ("cancelled", "dismissed in the client")
    ]


async def test_a_refusal_message_is_capped_and_sanitised(deployment: Deployment) -> None:
    hostile = "not\x00allowed\n\u202eby\u200b policy " + "y" * 1000
    client = ScriptedClient(Answer.cancel(hostile))
    async with scripted_peer(deployment.connector, deployment.local_user, client) as wire:
        await asyncio.wait_for(wire.prompt(), 10)
    outcome = wire.agent.outcomes[0]
    assert outcome.status is AuthorizationStatus.REFUSED and outcome.client_message is not None
    assert outcome.client_message.startswith("not allowed by policy y")
    assert len(outcome.client_message) <= 200 and outcome.client_message.endswith("…")
    assert all(ch.isprintable() for ch in outcome.client_message)
    (event,) = [e for e in await audit_events(deployment, outcome.elicitation_id or "") if e.event == "refused"]
    assert event.detail["client_message"] == outcome.client_message


async def test_client_gone_mid_create_ends_the_wait_and_the_elicitation(deployment: Deployment) -> None:
    connector = deployment.connector
    client = ScriptedClient("hold")  # the user never answers ...
    async with scripted_peer(connector, deployment.local_user, client) as wire:
        prompt = wire.prompt()
        elicitation = await client.next_elicitation()
        await wire.conn.close()  # ... and the client goes away
        authorization = wire.agent.authorizations[wire.session_id]
        outcome = await asyncio.wait_for(authorization, 10)
        assert outcome.status is AuthorizationStatus.DISCONNECTED and outcome.reason == "client_disconnected"
        record = await connector.elicitation(elicitation.elicitation_id or "")
        assert record is not None and record.status is ElicitationStatus.CANCELLED
        assert record.failure_reason == "client_disconnected"
        events = [e.event for e in await audit_events(deployment, record.id)]
        assert events[-1] == "client_disconnected"
        prompt.cancel()
        await asyncio.gather(prompt, return_exceptions=True)
    assert connector.runtime.acp.tables() == {
        "links": 0,
        "deliveries": 0,
        "blocked_sessions": 0,
        "state_listeners": 0,
    }


async def test_attach_before_initialize_waits_for_the_capabilities(deployment: Deployment) -> None:
    connector = deployment.connector
    client = ScriptedClient("decline")
    agent = ConnectorAgent(connector, deployment.local_user)  # attaches in on_connect
    agent_end, client_end = memory_transport_pair()
    agent_conn = AgentSideConnection(agent, agent_end, use_unstable_protocol=True)
    conn = client.connect(client_end)
    try:
        assert agent.conn is not None
        early = asyncio.create_task(
            connector.request_authorization(
                agent.conn, user=deployment.local_user, provider="github", scopes=["repo"], scope=SessionScope("s")
            )
        )
        await asyncio.sleep(0.05)
        assert not early.done()  # it waits for the client's initialize instead of answering "unsupported"
        await client.initialize(conn)
        outcome = await asyncio.wait_for(early, 10)
        assert outcome.status is AuthorizationStatus.DECLINED
        assert len(client.received("elicitation/create")) == 1
    finally:
        await conn.close()
        await agent_conn.close()


async def test_attach_after_initialize_without_capabilities_is_refused_clearly(deployment: Deployment) -> None:
    connector = deployment.connector
    client = ScriptedClient("decline")
    agent = ConnectorAgent(connector, deployment.local_user, attach=False)
    async with scripted_peer(connector, deployment.local_user, client, agent) as wire:
        assert agent.conn is not None
        with pytest.raises(ClientNotInitialized, match=re.escape("attach it with Connector.attach()")):
            await connector.request_authorization(
                agent.conn, user=deployment.local_user, provider="github", scopes=["repo"], scope=SessionScope("s")
            )
        # With the capabilities the agent got in initialize, it works.
        outcome = await connector.request_authorization(
            agent.conn,
            agent.capabilities,
            user=deployment.local_user,
            provider="github",
            scopes=["repo"],
            scope=SessionScope(wire.session_id),
        )
        assert outcome.status is AuthorizationStatus.DECLINED


async def test_no_initialize_within_the_bound_raises(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("service.acp.authorizer.INITIALIZE_WAIT_SECONDS", 0.2)
    agent = ConnectorAgent(deployment.connector, deployment.local_user)
    agent_end, _client_end = memory_transport_pair()
    agent_conn = AgentSideConnection(agent, agent_end, use_unstable_protocol=True)
    try:
        assert agent.conn is not None
        with pytest.raises(ClientNotInitialized, match=re.escape("no initialize within 0.2 s")):
            await deployment.connector.request_authorization(
                agent.conn, user=deployment.local_user, provider="github", scopes=["repo"], scope=SessionScope("s")
            )
    finally:
        await agent_conn.close()


def test_sdk_versions_outside_the_tested_range_are_refused_by_name() -> None:
    check_sdk_version()  # the installed one
    check_sdk_version("0.12.7")
    for version in ("0.13.0", "0.12.0", "1.0.0", "0.11.9", "nonsense"):
        with pytest.raises(AcpSdkUnsupported, match=re.escape(f"agent-client-protocol {version} is not supported")):
            check_sdk_version(version)


async def test_attach_checks_the_sdk_and_the_connection(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(AcpSdkUnsupported, match="object is not an agent-side connection of agent-client-protocol"):
        deployment.connector.attach(object())  # type: ignore[arg-type]
    monkeypatch.setattr("service.acp.adapter.sdk_version", lambda: "0.14.2")
    agent_end, _client_end = memory_transport_pair()
    with pytest.raises(AcpSdkUnsupported, match=re.escape("agent-client-protocol 0.14.2 is not supported")):
        AgentSideConnection(ConnectorAgent(deployment.connector, deployment.local_user), agent_end)


async def test_a_response_after_the_request_was_withdrawn_is_dropped_quietly(deployment: Deployment) -> None:
    """$/cancel_request, then the client's -32800 for it: the late answer changes nothing and logs no warning."""
    connector = deployment.connector
    client = ScriptedClient("hold")
    async with scripted_peer(connector, deployment.local_user, client) as wire:
        prompt = wire.prompt()
        elicitation = await client.next_elicitation()
        wire.agent.authorizations[wire.session_id].cancel()  # the agent gives up on it
        assert (await asyncio.wait_for(prompt, 10)).stop_reason == "end_turn"
        await asyncio.wait_for(elicitation.answered.wait(), 10)
        assert elicitation.error_code == -32800
        await eventually(
            lambda: status_is(connector, elicitation.elicitation_id or "", ElicitationStatus.CANCELLED),
            "the elicitation ends cancelled",
        )
        assert wire.agent.stops == ["cancelled"]
        await asyncio.wait_for(wire.conn.new_session(cwd="/"), 10)  # still connected


def test_request_scope_needs_an_id_that_can_be_sent() -> None:
    for bad in (None, True, 1.5, ["x"]):
        with pytest.raises(ValueError, match="RequestScope"):
            RequestScope(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("request_id", [0, "auth-1", 2**53 + 1])
async def test_request_scoped_elicitation_carries_its_request_id_on_the_wire(
    deployment: Deployment, request_id: int | str
) -> None:
    """`requestId` 0 is an id like any other: it is sent, not dropped as a default."""
    client = ScriptedClient("decline")
    agent = ConnectorAgent(deployment.connector, deployment.local_user)
    agent.scope_for = lambda _session: RequestScope(request_id)
    async with scripted_peer(deployment.connector, deployment.local_user, client, agent) as wire:
        await asyncio.wait_for(wire.prompt(), 10)
    (create,) = client.received("elicitation/create")
    assert create["params"]["requestId"] == request_id and "sessionId" not in create["params"]
    assert wire.agent.outcomes[0].status is AuthorizationStatus.DECLINED
