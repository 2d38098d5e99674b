"""The scripted ACP client's own rules, driven by a raw agent writing JSON-RPC by hand (misbehaving on purpose)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from acp.client.connection import ClientSideConnection

from service.testing import Answer, ScriptedClient, memory_transport_pair, spawn_agent
from service.testing.acp_client import (
    FORM_AND_URL,
    FORM_ONLY,
    NO_ELICITATION,
    OMITTED,
    URL_ONLY,
    ConsentRequired,
    IgnoredMessage,
    Transport,
)

SESSION = "sess-1"
CONNECT = "https://connector.example.com/connect/abc"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}}


@dataclass
class RawAgent:
    """The agent's end of an in-memory connection, speaking raw JSON-RPC."""

    transport: Transport
    inbox: list[dict[str, Any]] = field(default_factory=list)
    next_id: int = 100

    async def receive(self) -> dict[str, Any]:
        message = await asyncio.wait_for(self.transport.receive(), 5)
        assert message is not None, "the client closed the connection"
        self.inbox.append(message)
        return message

    async def request(self, method: str, params: dict[str, Any]) -> int:
        self.next_id += 1
        await self.transport.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return self.next_id

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.transport.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def response_to(self, request_id: int) -> dict[str, Any]:
        while True:
            message = await self.receive()
            if "method" not in message and message.get("id") == request_id:
                return message

    async def serve_handshake(self, protocol_version: int = 1) -> dict[str, Any]:
        """Answer initialize and session/new; returns the initialize params as the client sent them."""
        init = await self.receive()
        assert init["method"] == "initialize"
        await self.transport.send({"jsonrpc": "2.0", "id": init["id"], "result": {"protocolVersion": protocol_version}})
        new = await self.receive()
        assert new["method"] == "session/new"
        await self.transport.send({"jsonrpc": "2.0", "id": new["id"], "result": {"sessionId": SESSION}})
        return dict(init["params"])

    async def elicit_url(self, elicitation_id: str = "el-1", url: str = CONNECT, **scope: Any) -> int:
        params = {"mode": "url", "message": "Authorize GitHub", "elicitationId": elicitation_id, "url": url}
        return await self.request("elicitation/create", {**(scope or {"sessionId": SESSION}), **params})


@dataclass
class Pair:
    client: ScriptedClient
    conn: ClientSideConnection
    agent: RawAgent
    init_params: dict[str, Any]


async def _pair(client: ScriptedClient, protocol_version: int = 1) -> Pair:
    agent_end, client_end = memory_transport_pair()
    agent = RawAgent(agent_end)
    conn = client.connect(client_end)
    handshake = asyncio.create_task(agent.serve_handshake(protocol_version))
    await client.initialize(conn)
    await conn.new_session(cwd="/")
    return Pair(client, conn, agent, await handshake)


@pytest.fixture
async def pairs() -> AsyncIterator[list[Pair]]:
    made: list[Pair] = []
    yield made
    for pair in made:
        await pair.conn.close()


async def connected(pairs: list[Pair], client: ScriptedClient, protocol_version: int = 1) -> Pair:
    pair = await _pair(client, protocol_version)
    pairs.append(pair)
    return pair


# -- capabilities go on the wire exactly as given ------------------------------------------------------------
@pytest.mark.parametrize(
    ("capabilities", "field_name", "expected", "form", "url"),
    [
        (URL_ONLY, "clientCapabilities", {"elicitation": {"url": {}}}, False, True),
        (FORM_AND_URL, "clientCapabilities", {"elicitation": {"form": {}, "url": {}}}, True, True),
        (FORM_ONLY, "clientCapabilities", {"elicitation": {"form": {}}}, True, False),
        (NO_ELICITATION, "clientCapabilities", {}, False, False),
        ({"elicitation": {}}, "clientCapabilities", {"elicitation": {}}, False, False),
        ({"elicitation": None}, "clientCapabilities", {"elicitation": None}, False, False),
        ({"elicitation": {"url": None}}, "clientCapabilities", {"elicitation": {"url": None}}, False, False),
        (
            {"elicitation": {"form": None, "url": None}},
            "clientCapabilities",
            {"elicitation": {"form": None, "url": None}},
            False,
            False,
        ),
        (None, "clientCapabilities", None, False, False),
        (URL_ONLY, "capabilities", {"elicitation": {"url": {}}}, False, True),
    ],
)
async def test_capabilities_are_sent_verbatim(
    pairs: list[Pair], capabilities: Any, field_name: str, expected: Any, form: bool, url: bool
) -> None:
    client = ScriptedClient(capabilities=capabilities, capabilities_field=field_name)
    pair = await connected(pairs, client)
    assert field_name in pair.init_params and pair.init_params[field_name] == expected
    other = "capabilities" if field_name == "clientCapabilities" else "clientCapabilities"
    assert other not in pair.init_params
    assert (client.advertises("form"), client.advertises("url")) == (form, url)


async def test_omitted_capabilities_leave_the_field_out(pairs: list[Pair]) -> None:
    pair = await connected(pairs, ScriptedClient(capabilities=OMITTED, protocol_version=2))
    assert "clientCapabilities" not in pair.init_params and "capabilities" not in pair.init_params
    assert pair.init_params["protocolVersion"] == 2


# -- answers ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("accept", {"result": {"action": "accept"}}),
        ("decline", {"result": {"action": "decline"}}),
        ("cancel", {"result": {"action": "cancel"}}),
        (Answer.error(-32001, "no UI"), {"error": {"code": -32001, "message": "no UI", "data": None}}),
        (-32603, {"error": {"code": -32603, "message": "Scripted error", "data": None}}),
    ],
)
async def test_answers_as_scripted(pairs: list[Pair], answer: Any, expected: dict[str, Any]) -> None:
    pair = await connected(pairs, ScriptedClient(answer))
    request_id = await pair.agent.elicit_url()
    response = await pair.agent.response_to(request_id)
    assert {k: v for k, v in response.items() if k in ("result", "error")} == expected
    assert pair.client.elicitations[0].response == response


async def test_a_sequence_of_answers_is_used_in_order(pairs: list[Pair]) -> None:
    pair = await connected(pairs, ScriptedClient(["decline", "accept"]))
    first = await pair.agent.response_to(await pair.agent.elicit_url("el-1"))
    second = await pair.agent.response_to(await pair.agent.elicit_url("el-2"))
    third = await pair.agent.response_to(await pair.agent.elicit_url("el-3"))
    assert [m["result"]["action"] for m in (first, second, third)] == ["decline", "accept", "accept"]


@pytest.mark.parametrize(
    ("capabilities", "request_params"),
    [
        (URL_ONLY, {"sessionId": SESSION, "mode": "form", "message": "Name?", "requestedSchema": SCHEMA}),
        (FORM_ONLY, {"sessionId": SESSION, "mode": "url", "message": "m", "elicitationId": "e", "url": CONNECT}),
        (
            {"elicitation": {"url": None}},
            {"sessionId": SESSION, "mode": "url", "message": "m", "elicitationId": "e", "url": CONNECT},
        ),
        ({}, {"sessionId": SESSION, "mode": "url", "message": "m", "elicitationId": "e", "url": CONNECT}),
    ],
)
async def test_unadvertised_mode_is_answered_with_invalid_params(
    pairs: list[Pair], capabilities: Any, request_params: dict[str, Any]
) -> None:
    client = ScriptedClient("accept", capabilities=capabilities)
    pair = await connected(pairs, client)
    response = await pair.agent.response_to(await pair.agent.request("elicitation/create", request_params))
    assert response["error"]["code"] == -32602
    assert [v.rule for v in client.violations] == ["mode_not_advertised"]
    assert not client.elicitations[0].consented


async def test_form_mode_accept_carries_the_scripted_content(pairs: list[Pair]) -> None:
    client = ScriptedClient(Answer.accept({"name": "Mona"}), capabilities=FORM_AND_URL)
    pair = await connected(pairs, client)
    params = {"sessionId": SESSION, "mode": "form", "message": "Name?", "requestedSchema": SCHEMA}
    response = await pair.agent.response_to(await pair.agent.request("elicitation/create", params))
    assert response["result"] == {"action": "accept", "content": {"name": "Mona"}}
    assert client.violations == []


# -- consent before the URL ------------------------------------------------------------------------------------
async def test_url_is_handed_out_only_after_consent(pairs: list[Pair]) -> None:
    client = ScriptedClient(["decline", "hold"])
    pair = await connected(pairs, client)
    await pair.agent.response_to(await pair.agent.elicit_url("el-1"))
    declined = client.elicitations[0]
    with pytest.raises(ConsentRequired):
        _ = declined.url
    assert (await client.next_elicitation()) is declined
    held_id = await pair.agent.elicit_url("el-2")
    held = await client.next_elicitation()
    assert held.elicitation_id == "el-2"
    with pytest.raises(ConsentRequired):
        _ = held.url
    held.release("accept")
    response = await pair.agent.response_to(held_id)
    assert response["result"] == {"action": "accept"}
    assert held.url == CONNECT
    assert await client.next_consented_url() == CONNECT  # only the accepted one is ever queued


# -- $/cancel_request ------------------------------------------------------------------------------------------
async def test_cancel_request_for_a_pending_elicitation_is_answered_with_32800(pairs: list[Pair]) -> None:
    client = ScriptedClient("hold")
    pair = await connected(pairs, client)
    request_id = await pair.agent.elicit_url()
    held = await client.next_elicitation()
    await pair.agent.notify("$/cancel_request", {"requestId": request_id})
    response = await pair.agent.response_to(request_id)
    assert response["error"]["code"] == -32800
    assert held.cancel_requested and held.error_code == -32800 and not held.consented
    held.release("accept")  # a late decision changes nothing: one response per request
    await pair.agent.notify("$/cancel_request", {"requestId": request_id})  # already answered: ignored
    await pair.agent.notify("$/cancel_request", {"requestId": 9999})  # unknown: ignored
    await _settle(client, lambda: len(client.ignored) == 2)
    assert client.ignored == [
        IgnoredMessage("$/cancel_request", request_id, "already_answered"),
        IgnoredMessage("$/cancel_request", 9999, "unknown"),
    ]
    assert len(client.responses_to(request_id)) == 1


async def test_cancel_request_right_behind_the_create_is_answered_with_32800(pairs: list[Pair]) -> None:
    client = ScriptedClient("accept")
    pair = await connected(pairs, client)
    request_id = await pair.agent.elicit_url()
    await pair.agent.notify("$/cancel_request", {"requestId": request_id})  # before the client could answer
    response = await pair.agent.response_to(request_id)
    assert response["error"]["code"] == -32800
    assert not client.elicitations[0].consented


async def test_cancel_request_after_the_answer_is_ignored(pairs: list[Pair]) -> None:
    client = ScriptedClient("accept")
    pair = await connected(pairs, client)
    request_id = await pair.agent.elicit_url()
    assert (await pair.agent.response_to(request_id))["result"] == {"action": "accept"}
    await pair.agent.notify("$/cancel_request", {"requestId": request_id})
    await _settle(client, lambda: bool(client.ignored))
    assert client.ignored == [IgnoredMessage("$/cancel_request", request_id, "already_answered")]
    assert len(client.responses_to(request_id)) == 1


# -- elicitation/complete --------------------------------------------------------------------------------------
async def test_complete_for_unknown_or_completed_ids_is_ignored(pairs: list[Pair]) -> None:
    client = ScriptedClient("accept")
    pair = await connected(pairs, client)
    await pair.agent.response_to(await pair.agent.elicit_url("el-1"))
    await pair.agent.notify("elicitation/complete", {"elicitationId": "never-sent"})
    await pair.agent.notify("elicitation/complete", {"elicitationId": "el-1"})
    await pair.agent.notify("elicitation/complete", {"elicitationId": "el-1"})
    assert await client.next_completion() == "el-1"
    await _settle(client, lambda: len(client.ignored) == 2)
    assert client.completions == ["el-1"]
    assert client.ignored == [
        IgnoredMessage("elicitation/complete", "never-sent", "unknown"),
        IgnoredMessage("elicitation/complete", "el-1", "already_completed"),
    ]
    assert client.elicitations[0].completed


# -- what the client flags about the request -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "flags"),
    [
        (CONNECT, []),
        ("http://127.0.0.1:8700/connect/abc", []),
        ("https://xn--gthub-n4a.com/connect/abc", ["punycode_host"]),
        ("https://g\u0456thub.com/connect/abc", ["punycode_host", "mixed_script_host"]),  # Cyrillic i
        ("http://connector.example.com/connect/abc", ["not_https"]),
        ("https://alice:pw@connector.example.com/connect/abc", ["credentials_in_url"]),
    ],
)
async def test_suspicious_urls_are_flagged(pairs: list[Pair], url: str, flags: list[str]) -> None:
    client = ScriptedClient("decline")
    pair = await connected(pairs, client)
    await pair.agent.response_to(await pair.agent.elicit_url(url=url))
    assert client.elicitations[0].flags == flags
    if "credentials_in_url" in flags:
        assert [v.rule for v in client.violations] == ["credentials_in_url"]


async def test_duplicate_outstanding_elicitation_id_is_a_violation(pairs: list[Pair]) -> None:
    client = ScriptedClient("accept")
    pair = await connected(pairs, client)
    await pair.agent.response_to(await pair.agent.elicit_url("el-1"))
    await pair.agent.response_to(await pair.agent.elicit_url("el-1"))  # el-1 is still outstanding
    assert [v.rule for v in client.violations] == ["duplicate_elicitation_id"]
    await pair.agent.notify("elicitation/complete", {"elicitationId": "el-1"})
    await pair.agent.notify("elicitation/complete", {"elicitationId": "el-1"})
    await client.next_completion()
    await client.next_completion()
    await pair.agent.response_to(await pair.agent.elicit_url("el-1"))  # reuse after completion is fine
    assert [v.rule for v in client.violations] == ["duplicate_elicitation_id"]


async def test_unknown_session_is_a_violation(pairs: list[Pair]) -> None:
    client = ScriptedClient("decline")
    pair = await connected(pairs, client)
    await pair.agent.response_to(await pair.agent.elicit_url(sessionId="sess-of-someone-else"))
    await pair.agent.response_to(await pair.agent.elicit_url("el-2", requestId=7))  # request-scoped: no session
    assert [v.rule for v in client.violations] == ["unknown_session"]
    assert client.elicitations[1].scope_request_id == 7


async def test_state_updates_are_recorded_not_handed_to_the_sdk(
    pairs: list[Pair], caplog: pytest.LogCaptureFixture
) -> None:
    client = ScriptedClient("accept", protocol_version=2)
    pair = await connected(pairs, client, protocol_version=2)
    update = {"sessionUpdate": "state_update", "state": "requires_action"}
    await pair.agent.notify("session/update", {"sessionId": SESSION, "update": update})
    await pair.agent.notify("session/update", {"sessionId": SESSION, "update": {**update, "state": "running"}})
    await _settle(client, lambda: len(client.state_updates) == 2)
    assert [(s.session_id, s.state) for s in client.state_updates] == [
        (SESSION, "requires_action"),
        (SESSION, "running"),
    ]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_transcript_records_both_directions_in_order(pairs: list[Pair]) -> None:
    client = ScriptedClient("accept")
    pair = await connected(pairs, client)
    request_id = await pair.agent.elicit_url()
    await pair.agent.response_to(request_id)
    methods = [(w.direction, w.message.get("method") or "response") for w in client.transcript]
    assert methods == [
        ("out", "initialize"),
        ("in", "response"),
        ("out", "session/new"),
        ("in", "response"),
        ("in", "elicitation/create"),
        ("out", "response"),
    ]
    assert CONNECT in client.wire_text()


async def test_non_json_on_the_agents_stdout_is_a_violation() -> None:
    client = ScriptedClient()
    script = "import sys; print('hello from a chatty agent'); sys.stdout.flush(); sys.stdin.read()"
    async with spawn_agent(client, sys.executable, "-c", script) as agent:
        await _settle(client, lambda: bool(client.violations))
        assert agent.process.returncode is None
    assert [v.rule for v in client.violations] == ["stdout_not_json"]


async def _settle(client: ScriptedClient, condition: Any, within: float = 5.0) -> None:
    """Wait (event-loop turns, bounded) until `condition()` holds: notifications have no response to await."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)
