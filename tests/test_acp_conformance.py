"""Every rule of the ACP elicitation text that binds the Agent, checked on the wire.

Each test runs twice: against the embedded connector, and against the Python sidecar client (`SidecarClient`)
talking to a real sidecar process (one per test worker, each test a tenant of its own); the assertions on the wire
are the same. The README's "Protocol conformance" table points at the tests here.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from acp.exceptions import RequestError

from service import AuthorizationStatus, ElicitationStatus, Identity, RequestScope, SessionScope
from service.client import SidecarClient
from service.core.handles import new_id
from service.core.records import ElicitationRecord, GrantRecord
from service.store import Store
from service.testing import MockOAuthProvider, ScriptedBrowser

from .acp_peers import (
    AgentFacing,
    ConnectorAgent,
    RawClient,
    RecordingClient,
    connect,
    eventually,
    raw_peer,
    status_is,
)
from .api_support import make_key
from .conftest import ALICE, BOB, Deploy
from .sidecar_support import REFUSED_SCOPE, SharedSidecar, shared_sidecar

URL = {"url": {}}


@dataclass
class Deployment:
    """The agent's side (`connector`: embedded `Connector` or `SidecarClient`) and the store it writes to."""

    connector: AgentFacing
    store: Store
    base_url: str
    local_user: Identity

    async def elicitation(self, elicitation_id: str) -> ElicitationRecord | None:
        return await self.store.elicitations.get(elicitation_id)


@pytest.fixture(params=["embedded", "sidecar"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return request.getfixturevalue(f"{request.param}_deployment")  # type: ignore[no-any-return]


@pytest.fixture
async def embedded_deployment(deploy_with: Deploy, mock_provider: MockOAuthProvider) -> AsyncIterator[Deployment]:
    mock_provider.narrow_scopes = {REFUSED_SCOPE}  # as the shared sidecar's provider
    async with deploy_with() as embedded:
        connector = embedded.connector
        yield Deployment(connector, connector.runtime.store, embedded.base_url, embedded.local_user)


@pytest.fixture(scope="session")
def sidecar_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedSidecar]:
    """One sidecar process for every sidecar test of a worker (starting one takes seconds)."""
    with shared_sidecar(tmp_path_factory.mktemp("sidecar")) as sidecar:
        yield sidecar


@pytest.fixture
async def sidecar_deployment(sidecar_process: SharedSidecar) -> AsyncIterator[Deployment]:
    """The shared sidecar, as a tenant of this test's own that starts without grants (they belong to users)."""
    store = Store.from_url(sidecar_process.database_url)
    try:
        for user in (ALICE, BOB):
            for grant in await store.grants.find(user, "github"):
                await store.grants.delete(grant.id)
        key = await make_key(store, tenant=f"conformance-{uuid.uuid4().hex[:12]}")
        async with SidecarClient(sidecar_process.base_url, key) as client:
            yield Deployment(client, store, sidecar_process.base_url, ALICE)
    finally:
        await store.close()


# (elicitation capability as sent, URL mode advertised?)
CAPABILITY_TABLE: list[tuple[Any, bool]] = [
    ("<omitted>", False),
    (None, False),
    ({}, False),
    ({"form": None, "url": None}, False),
    ({"form": {}}, False),
    ({"form": {}, "url": None}, False),
    ({"url": None}, False),
    ({"url": {}}, True),
    ({"form": {}, "url": {}}, True),
    ({"form": None, "url": {}}, True),
    ({"url": {"_meta": {"x": 1}}}, True),
]


def raw(
    deployment: Deployment, client: RawClient, version: int = 1, elicitation: Any = URL
) -> AbstractAsyncContextManager[ConnectorAgent]:
    """The connector's test agent and `client` connected, initialized with `elicitation`; closed on exit."""
    return raw_peer(deployment.connector, deployment.local_user, client, initialize_params(version, elicitation))


def initialize_params(version: int, elicitation: Any) -> dict[str, Any]:
    capabilities: dict[str, Any] = {}
    if elicitation != "<omitted>":
        capabilities["elicitation"] = elicitation
    key = "clientCapabilities" if version == 1 else "capabilities"
    return {"protocolVersion": version, key: capabilities}


@pytest.mark.parametrize("version", [1, 2], ids=["v1-clientCapabilities", "v2-capabilities"])
@pytest.mark.parametrize(("elicitation", "advertised"), CAPABILITY_TABLE, ids=[repr(c[0]) for c in CAPABILITY_TABLE])
async def test_capabilities_as_sent_on_the_wire(
    deployment: Deployment, version: int, elicitation: Any, advertised: bool
) -> None:
    client = RawClient({"action": "decline"})
    audited_before = len(await deployment.store.audit.list(event="unsupported_client"))
    async with raw(deployment, client, version, elicitation) as agent:
        session = await client.new_session()
        await asyncio.wait_for(client.prompt(session), 10)
        creates = client.received("elicitation/create")
        if advertised:
            assert [c["params"]["mode"] for c in creates] == ["url"]
            assert agent.outcomes[0].status is AuthorizationStatus.DECLINED
        else:
            assert creates == []  # nothing sent, and never a form-mode fallback
            assert agent.outcomes[0].status is AuthorizationStatus.UNSUPPORTED
            # Audited alike on both faces (the sidecar client tells the sidecar).
            audited = await deployment.store.audit.list(event="unsupported_client")
            assert len(audited) == audited_before + 1 and audited[-1].provider == "github"
        assert all(m.get("params", {}).get("mode") != "form" for m in creates)


async def test_same_session_id_on_two_connections_never_crosses(deployment: Deployment) -> None:
    connector = deployment.connector
    first, second = RecordingClient(), RecordingClient()
    wire_a = await connect(connector, deployment.local_user, first)
    wire_b = await connect(connector, deployment.local_user, second)
    prompt_a = asyncio.create_task(wire_a.client_conn.prompt(session_id="sess-1", prompt=[]))
    prompt_b = asyncio.create_task(wire_b.client_conn.prompt(session_id="sess-1", prompt=[]))
    url_a, url_b = await first.next_url(), await second.next_url()
    assert url_a != url_b
    async with ScriptedBrowser() as browser:
        assert (await browser.authorize(url_b)).status_code == 200
    await asyncio.wait_for(prompt_b, 10)
    id_b = wire_b.received("elicitation/create")[0]["params"]["elicitationId"]
    assert second.completions == [id_b] and first.completions == []
    # The other connection's elicitation for the same session id is still waiting on its own user.
    id_a = wire_a.received("elicitation/create")[0]["params"]["elicitationId"]
    record_a = await deployment.elicitation(id_a)
    assert record_a is not None and record_a.status is ElicitationStatus.CONSENTED
    assert record_a.connection_key != (await deployment.elicitation(id_b)).connection_key  # type: ignore[union-attr]
    prompt_a.cancel()
    await wire_a.close()
    await wire_b.close()


async def store_narrowed_grant(deployment: Deployment) -> None:
    """Alice's grant of `repo`, made when the provider refused `admin:org`."""
    now = datetime.now(UTC)
    metadata_only = b"never decrypted: no token is used here"
    grant = GrantRecord(
        new_id(16), ALICE, "github", "acct-n", ("repo",), "k1", metadata_only, None, now, now, ("admin:org",)
    )
    await deployment.store.grants.upsert(grant)


async def test_a_narrowed_grant_is_answered_without_a_new_elicitation_unless_asked_again(
    deployment: Deployment,
) -> None:
    """Issue 18: scopes the provider refused when the grant was made are not asked for again on every request
    (`narrowed`, with the refused scopes), until the agent asks again explicitly."""
    await store_narrowed_grant(deployment)
    client = RecordingClient(answer="decline")
    wire = await connect(deployment.connector, ALICE, client)
    wire.agent.scopes = ["repo", "admin:org"]
    for _ in range(2):
        await asyncio.wait_for(wire.client_conn.prompt(session_id="sess-1", prompt=[]), 10)
    assert wire.received("elicitation/create") == []
    for outcome in wire.agent.outcomes:
        assert (outcome.status, outcome.refused_scopes, outcome.elicitation_id) == (
            AuthorizationStatus.NARROWED,
            ("admin:org",),
            None,
        )
        assert outcome.granted_scopes == ("repo",) and not outcome.ok
    wire.agent.ask_again = True
    await asyncio.wait_for(wire.client_conn.prompt(session_id="sess-1", prompt=[]), 10)
    assert len(wire.received("elicitation/create")) == 1
    assert wire.agent.outcomes[-1].status is AuthorizationStatus.DECLINED
    await wire.close()


async def test_a_client_without_url_mode_is_answered_narrowed_from_the_stored_grant(deployment: Deployment) -> None:
    """Stored grants are looked at before the client's capabilities: a client that cannot take a URL-mode
    elicitation still gets `narrowed` (not `unsupported`), and nothing is sent to it."""
    await store_narrowed_grant(deployment)
    client = RawClient({"action": "decline"})
    async with raw(deployment, client, elicitation={"form": {}}) as agent:
        agent.scopes = ["repo", "admin:org"]
        session = await client.new_session()
        await asyncio.wait_for(client.prompt(session), 10)
        assert client.received("elicitation/create") == []
        assert [(o.status, o.refused_scopes, o.elicitation_id) for o in agent.outcomes] == [
            (AuthorizationStatus.NARROWED, ("admin:org",), None)
        ]


async def test_a_grant_the_provider_narrowed_is_completed_once_and_answered_narrowed(deployment: Deployment) -> None:
    """The provider grants less than asked: the elicitation still completed, so the client receives
    `elicitation/complete` once, and the agent `narrowed` with the refused scope."""
    client = RecordingClient()
    wire = await connect(deployment.connector, deployment.local_user, client)
    wire.agent.scopes = ["repo", REFUSED_SCOPE]
    prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=[]))
    url = await client.next_url()
    async with ScriptedBrowser() as browser:
        assert (await browser.authorize(url)).status_code == 200
    await asyncio.wait_for(prompt, 10)
    elicitation_id = wire.received("elicitation/create")[0]["params"]["elicitationId"]
    assert [(o.status, o.refused_scopes, o.elicitation_id) for o in wire.agent.outcomes] == [
        (AuthorizationStatus.NARROWED, (REFUSED_SCOPE,), elicitation_id)
    ]
    await wire.client_conn.new_session(cwd="/")  # a round trip: a second completion would have arrived first
    assert client.completions == [elicitation_id]
    await wire.close()


async def test_same_session_id_for_two_users_binds_each_user(deployment: Deployment) -> None:
    """Bob's elicitation in session "sess-1" cannot be completed by the local user's browser."""
    connector = deployment.connector
    client = RecordingClient()
    wire = await connect(connector, BOB, client)
    prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=[]))
    url = await client.next_url()
    async with ScriptedBrowser() as browser:  # the browser belongs to the local user, not Bob
        refused = await browser.authorize(url)
    assert refused.status_code == 403 and refused.headers["x-connector-error"] == "identity_mismatch"
    assert await deployment.store.grants.find(BOB, "github") == []
    assert await deployment.store.grants.find(deployment.local_user, "github") == []
    assert client.completions == []
    prompt.cancel()
    await wire.close()


async def test_many_outstanding_elicitations_on_one_connection_are_tracked_individually(
    deployment: Deployment,
) -> None:
    connector = deployment.connector
    client = RecordingClient()
    wire = await connect(connector, deployment.local_user, client)
    assert wire.agent.conn is not None
    requests = [
        asyncio.create_task(
            connector.request_authorization(
                wire.agent.conn,
                user=deployment.local_user,
                provider="github",
                scopes=[f"scope-{i}"],
                scope=SessionScope("sess-1", f"call-{i}"),
            )
        )
        for i in range(3)
    ]
    urls = [await client.next_url() for _ in requests]
    ids = [c["params"]["elicitationId"] for c in wire.received("elicitation/create")]
    assert len(set(ids)) == 3 and all(len(i) >= 22 for i in ids)
    async with ScriptedBrowser() as browser:
        assert (await browser.authorize(urls[1])).status_code == 200
    done, pending = await asyncio.wait(requests, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert [t.result().elicitation_id for t in done] == [ids[1]]
    assert len(pending) == 2
    assert client.completions == [ids[1]]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await wire.close()


async def test_session_cancel_sends_cancel_request_for_the_pending_create_only(deployment: Deployment) -> None:
    """Response-vs-cancel, cancel first: the late accept resumes nothing."""
    connector = deployment.connector
    client = RawClient({"action": "accept"}, hold=True)
    async with raw(deployment, client) as agent:
        session = await client.new_session()
        # An unrelated request-scoped elicitation on the same connection, outside the session.
        assert agent.conn is not None
        unrelated = asyncio.create_task(
            connector.request_authorization(
                agent.conn, user=deployment.local_user, provider="github", scopes=["other"], scope=RequestScope(7)
            )
        )
        unrelated_params = await client.next_create()
        prompt = asyncio.create_task(client.prompt(session))
        session_params = await client.next_create()

        await client.notify("session/cancel", {"sessionId": session})
        result = await asyncio.wait_for(prompt, 10)
        assert result == {"stopReason": "cancelled"}

        cancels = client.received("$/cancel_request")
        session_request_id = next(
            m["id"]
            for m in client.received("elicitation/create")
            if m["params"]["elicitationId"] == session_params["elicitationId"]
        )
        assert [c["params"] for c in cancels] == [{"requestId": session_request_id}]
        record = await deployment.elicitation(session_params["elicitationId"])
        assert record is not None and record.status is ElicitationStatus.CANCELLED
        assert record.failure_reason == "the client cancelled the session's work"  # the cause, on both faces
        # The client answered the cancelled request with -32800, which changed nothing.
        assert any(
            m.get("id") == session_request_id and m.get("error", {}).get("code") == -32800 for m in client.sent()
        )

        # The request-scoped elicitation is untouched by session/cancel and goes on when the client answers.
        other = await deployment.elicitation(unrelated_params["elicitationId"])
        assert other is not None and other.status is ElicitationStatus.PENDING
        client.release()
        await eventually(
            lambda: status_is(deployment, unrelated_params["elicitationId"], ElicitationStatus.CONSENTED),
            "the request-scoped elicitation goes on when the client accepts",
        )
        assert agent.outcomes == []  # the cancelled work never resumed
        unrelated.cancel()
        await asyncio.gather(unrelated, return_exceptions=True)


async def test_a_client_gone_while_the_user_is_in_the_browser_is_stored_as_a_disconnect(
    deployment: Deployment,
) -> None:
    """The client accepted, then went away before the browser finished: both faces store a disconnect (the
    `disconnected` outcome, its own audit event), not the agent cancelling; the sidecar client says why."""
    client = RawClient({"action": "accept"})
    async with raw(deployment, client):
        session = await client.new_session()
        prompt = asyncio.create_task(client.prompt(session))
        params = await client.next_create()
        await eventually(
            lambda: status_is(deployment, params["elicitationId"], ElicitationStatus.CONSENTED),
            "the client's accept is recorded",
        )
        await client.close()
        await eventually(
            lambda: status_is(deployment, params["elicitationId"], ElicitationStatus.CANCELLED),
            "the elicitation ends when its client goes away",
        )
        prompt.cancel()
        await asyncio.gather(prompt, return_exceptions=True)
    record = await deployment.elicitation(params["elicitationId"])
    assert record is not None and record.failure_reason == "client_disconnected"
    events = await deployment.store.audit.list(elicitation_id=record.id)
    assert (events[-1].event, events[-1].detail.get("cause")) == ("client_disconnected", "client_disconnected")


async def test_answer_first_then_cancel(deployment: Deployment) -> None:
    """Response-vs-cancel, response first: decline is processed, the work resumes, no $/cancel_request."""
    client = RawClient({"action": "decline"})
    async with raw(deployment, client) as agent:
        session = await client.new_session()
        await asyncio.wait_for(client.prompt(session), 10)
        await client.notify("session/cancel", {"sessionId": session})  # arrives after the work already resumed
        await client.new_session()  # a round trip: the agent has handled the cancel before it answers this
        assert agent.outcomes[0].status is AuthorizationStatus.DECLINED
        assert client.received("$/cancel_request") == []


async def test_cancel_while_in_browser_then_callback_stores_grant_but_resumes_nothing(
    deployment: Deployment,
) -> None:
    """Callback-vs-cancel, cancel first."""
    client = RawClient({"action": "accept"})
    async with raw(deployment, client) as agent:
        session = await client.new_session()
        prompt = asyncio.create_task(client.prompt(session))
        params = await client.next_create()
        async with ScriptedBrowser() as browser:
            page = await browser.get(params["url"])
            to_provider = await browser.submit(page, "continue")  # the user is now at the provider
            await client.notify("session/cancel", {"sessionId": session})
            assert await asyncio.wait_for(prompt, 10) == {"stopReason": "cancelled"}
            final = await browser.follow(to_provider)  # ... and comes back after the cancellation
        assert final.status_code == 200 and "already cancelled" in final.text
        assert client.received("$/cancel_request") == []  # the create request was already answered
        record = await deployment.elicitation(params["elicitationId"])
        assert record is not None and record.status is ElicitationStatus.CANCELLED
        assert len(await deployment.store.grants.find(deployment.local_user, "github")) == 1
        events = [e.event for e in await deployment.store.audit.list(elicitation_id=params["elicitationId"])]
        assert "completed_after_cancel" in events and "completed" not in events
        await client.new_session()  # a round trip: a completion sent before this answer would have arrived first
        assert client.received("elicitation/complete") == []  # decided: no completion for cancelled work
        assert agent.outcomes == []


async def test_callback_first_then_cancel(deployment: Deployment) -> None:
    """Callback-vs-cancel, callback first: the completion stands and is sent once."""
    client = RawClient({"action": "accept"})
    async with raw(deployment, client) as agent:
        session = await client.new_session()
        prompt = asyncio.create_task(client.prompt(session))
        params = await client.next_create()
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(params["url"])).status_code == 200
        await asyncio.wait_for(prompt, 10)
        await client.notify("session/cancel", {"sessionId": session})
        await client.new_session()  # a round trip: the cancel has been handled
        record = await deployment.elicitation(params["elicitationId"])
        assert record is not None and record.status is ElicitationStatus.COMPLETED
        assert [m["params"] for m in client.received("elicitation/complete")] == [
            {"elicitationId": params["elicitationId"]}
        ]
        assert agent.outcomes[0].status is AuthorizationStatus.AUTHORIZED


def states_on_wire(client: RawClient) -> list[tuple[str, str]]:
    return [
        (m["params"]["sessionId"], m["params"]["update"]["state"])
        for m in client.received("session/update")
        if m["params"]["update"].get("sessionUpdate") == "state_update"
    ]


async def test_v2_foreground_state_requires_action_then_running(deployment: Deployment) -> None:
    client = RawClient({"action": "accept"})
    async with raw(deployment, client, 2) as agent:
        session = await client.new_session()
        prompt = asyncio.create_task(client.prompt(session))
        params = await client.next_create()
        await eventually(
            lambda: status_is(deployment, params["elicitationId"], ElicitationStatus.CONSENTED), "the accept arrives"
        )  # the accept has arrived: it must change nothing
        assert states_on_wire(client) == [(session, "requires_action")]
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(params["url"])).status_code == 200
        await asyncio.wait_for(prompt, 10)
        assert states_on_wire(client) == [(session, "requires_action"), (session, "running")]
        assert agent.states == [(session, "requires_action"), (session, "running")]
        # running comes after elicitation/complete: progress resumes once the completion is out
        methods = [m.get("method") for d, m in client.messages if d == "in"]
        complete_at = methods.index("elicitation/complete")
        running_at = max(
            i
            for i, (d, m) in enumerate(m for m in client.messages if m[0] == "in")
            if m.get("params", {}).get("update", {}).get("state") == "running"
        )
        assert complete_at < running_at


async def test_v2_several_outstanding_cause_one_transition_each_way(deployment: Deployment) -> None:
    connector = deployment.connector
    client = RawClient({"action": "decline"}, hold=True)
    async with raw(deployment, client, 2) as agent:
        session = await client.new_session()
        assert agent.conn is not None
        tasks = [
            asyncio.create_task(
                connector.request_authorization(
                    agent.conn,
                    user=deployment.local_user,
                    provider="github",
                    scopes=[f"s{i}"],
                    scope=SessionScope(session, f"call-{i}"),
                )
            )
            for i in range(3)
        ]
        for _ in tasks:
            await client.next_create()
        client.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert states_on_wire(client) == [(session, "requires_action"), (session, "running")]


@pytest.mark.parametrize("kind", ["request-scoped", "background"])
async def test_request_scoped_and_background_elicitations_change_no_state(deployment: Deployment, kind: str) -> None:
    client = RawClient({"action": "decline"})
    async with raw(deployment, client, 2) as agent:
        if kind == "request-scoped":
            agent.scope_for = lambda sid: RequestScope("auth-1")
        else:
            agent.foreground = False
        session = await client.new_session()
        await asyncio.wait_for(client.prompt(session), 10)
        assert len(client.received("elicitation/create")) == 1
        assert states_on_wire(client) == [] and agent.states == []


async def test_v1_sends_no_state_update_but_the_agent_hears_transitions(deployment: Deployment) -> None:
    client = RawClient({"action": "decline"})
    async with raw(deployment, client) as agent:
        session = await client.new_session()
        await asyncio.wait_for(client.prompt(session), 10)
        assert states_on_wire(client) == []
        assert agent.states == [(session, "requires_action"), (session, "running")]


async def test_v2_cancelled_work_reports_idle(deployment: Deployment) -> None:
    client = RawClient({"action": "accept"}, hold=True)
    async with raw(deployment, client, 2) as _agent:
        session = await client.new_session()
        prompt = asyncio.create_task(client.prompt(session))
        await client.next_create()
        await client.notify("session/cancel", {"sessionId": session})
        await asyncio.wait_for(prompt, 10)
        assert states_on_wire(client) == [(session, "requires_action"), (session, "idle")]


async def test_incoming_cancel_request_is_answered_not_an_error(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = RawClient({"action": "accept"}, hold=True)
    async with raw(deployment, client) as _agent:
        session = await client.new_session()
        prompt = asyncio.create_task(client.prompt(session))
        await client.next_create()
        prompt_id = next(m["id"] for m in client.sent("session/prompt"))
        await client.notify("$/cancel_request", {"requestId": 9999})  # not in progress: ignored quietly
        await client.notify("$/cancel_request", {"requestId": prompt_id})
        try:
            outcome = await asyncio.wait_for(prompt, 10)
        except RequestError as exc:
            outcome = exc.code
        # The agent's prompt handler caught the cancellation and answered; either answer is allowed by the text.
        assert outcome in ({"stopReason": "cancelled"}, -32800)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not [r for r in caplog.records if "Method not found" in r.getMessage() or "Unhandled" in r.getMessage()]
