"""Every rule of the ACP elicitation text that binds the Agent, checked on the wire.

Each test runs against the embedded connector and against the Python sidecar client (`SidecarClient`) talking to a
real sidecar process (one per test worker, each test a tenant of its own); the tests that need nothing but the wire
and the store (`face`) also run against the TypeScript package (`@acp-connector/client`, the example agent on it in
a Node process, over stdio, on the same sidecar). The assertions on the wire are the same. The README's "Protocol
conformance" table points at the tests here.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
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
from .sidecar_support import REFUSED_SCOPE, RestartableSidecar, SharedSidecar, restartable_sidecar, shared_sidecar
from .ts_face import ts_raw_peer
from .ts_support import built_example

URL = {"url": {}}


@dataclass
class Deployment:
    """The agent's side (`connector`: embedded `Connector` or `SidecarClient`; for the TypeScript face the example
    agent's process, started by `raw`) and the store it writes to."""

    connector: AgentFacing
    store: Store
    base_url: str
    local_user: Identity
    typescript: tuple[str, str] | None = None  # the TypeScript face: the sidecar's URL and this test's API key
    tenant: str = "embedded"  # whose grants the agent's side sees (the embedded connector's own, or the key's)

    async def elicitation(self, elicitation_id: str) -> ElicitationRecord | None:
        return await self.store.elicitations.get(elicitation_id)


@pytest.fixture(params=["embedded", "sidecar"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return request.getfixturevalue(f"{request.param}_deployment")  # type: ignore[no-any-return]


@pytest.fixture(params=["embedded", "sidecar", "typescript"])
def face(request: pytest.FixtureRequest) -> Deployment:
    """The three faces, for tests that look only at the wire and the store."""
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


@asynccontextmanager
async def tenant_of(sidecar: SharedSidecar) -> AsyncIterator[tuple[Store, str, str]]:
    """The shared sidecar's store, an API key of a tenant of this test's own, and that tenant; its users start
    without grants."""
    store = Store.from_url(sidecar.database_url)
    try:
        for user in (ALICE, BOB):
            for grant in await store.grants.find(user, "github"):
                await store.grants.delete(grant.id)
        tenant = f"conformance-{uuid.uuid4().hex[:12]}"
        yield store, await make_key(store, tenant=tenant), tenant
    finally:
        await store.close()


@pytest.fixture
async def sidecar_deployment(sidecar_process: SharedSidecar) -> AsyncIterator[Deployment]:
    """The shared sidecar, as a tenant of this test's own that starts without grants (they belong to users)."""
    async with (
        tenant_of(sidecar_process) as (store, key, tenant),
        SidecarClient(sidecar_process.base_url, key) as client,
    ):
        yield Deployment(client, store, sidecar_process.base_url, ALICE, tenant=tenant)


@pytest.fixture
async def typescript_deployment(sidecar_process: SharedSidecar) -> AsyncIterator[Deployment]:
    """The TypeScript package's face on the shared sidecar (the example agent, started by `raw`)."""
    built_example()  # before the test's clock starts: the first build takes a while
    async with (
        tenant_of(sidecar_process) as (store, key, tenant),
        SidecarClient(sidecar_process.base_url, key) as unused,
    ):
        yield Deployment(unused, store, sidecar_process.base_url, ALICE, (sidecar_process.base_url, key), tenant)


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


@asynccontextmanager
async def raw_face(deployment: Deployment, client: RawClient, elicitation: Any = URL) -> AsyncIterator[None]:
    """`client` connected to the face's agent (the connector's test agent, or the TypeScript example agent) and
    initialized with `elicitation`; closed on exit. Only the wire and the store tell what happened."""
    params = initialize_params(1, elicitation)
    if deployment.typescript is None:
        async with raw(deployment, client, elicitation=elicitation):
            yield
        return
    url, key = deployment.typescript
    async with ts_raw_peer(url, key, deployment.local_user, client, params) as agent:
        try:
            yield
        except BaseException:
            print(f"the TypeScript agent's stderr:\n{agent.log()}")
            raise


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
        new_id(16),
        ALICE,
        "github",
        "acct-n",
        ("repo",),
        "k1",
        metadata_only,
        None,
        now,
        now,
        ("admin:org",),
        tenant=deployment.tenant,  # the agent's own: another tenant's grant would answer nothing
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


async def test_a_client_gone_while_the_user_is_in_the_browser_is_stored_as_a_disconnect(face: Deployment) -> None:
    """The client accepted, then went away before the browser finished: every face stores a disconnect (the
    `disconnected` outcome, its own audit event), not the agent cancelling; the sidecar clients say why."""
    deployment = face
    client = RawClient({"action": "accept"})
    async with raw_face(deployment, client):
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


async def test_answer_first_then_cancel(face: Deployment) -> None:
    """Response-vs-cancel, response first: decline is processed, the work resumes, no $/cancel_request."""
    client = RawClient({"action": "decline"})
    async with raw_face(face, client):
        session = await client.new_session()
        assert await asyncio.wait_for(client.prompt(session), 30) == {"stopReason": "end_turn"}
        await client.notify("session/cancel", {"sessionId": session})  # arrives after the work already resumed
        await client.new_session()  # a round trip: the agent has handled the cancel before it answers this
        [create] = client.received("elicitation/create")
        record = await face.elicitation(create["params"]["elicitationId"])
        assert record is not None and record.status is ElicitationStatus.DECLINED
        assert "declined access" in agent_text(client)  # the work resumed and said so
        assert client.received("$/cancel_request") == []


async def test_cancel_while_in_browser_then_callback_stores_grant_but_resumes_nothing(face: Deployment) -> None:
    """Callback-vs-cancel, cancel first."""
    deployment = face
    client = RawClient({"action": "accept"})
    async with raw_face(deployment, client):
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
        assert "Your repositories" not in agent_text(client)  # the cancelled work never resumed


async def test_callback_first_then_cancel(face: Deployment) -> None:
    """Callback-vs-cancel, callback first: the completion stands and is sent once."""
    deployment = face
    client = RawClient({"action": "accept"})
    async with raw_face(deployment, client):
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
        assert "Your repositories: octocat/hello-world" in agent_text(client)


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
    face: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = RawClient({"action": "accept"}, hold=True)
    async with raw_face(face, client):
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


def agent_text(client: RawClient) -> str:
    """What the agent said in the session (its `agent_message_chunk`s), as the client received it."""
    updates = [m["params"]["update"] for m in client.received("session/update")]
    return "".join(u["content"]["text"] for u in updates if u.get("sessionUpdate") == "agent_message_chunk")


class RacingClient(RawClient):
    """Answers every `elicitation/create` as clients that dismiss their UI on cancel do: `session/cancel` for the
    session and, at the same moment, its own `cancel` answer to the create."""

    async def handle(self, method: str, params: Any, is_notification: bool) -> Any:
        if method != "elicitation/create":
            return await super().handle(method, params, is_notification)
        self.creates.put_nowait(params)
        await self.notify("session/cancel", {"sessionId": params["sessionId"]})
        return {"action": "cancel"}


SESSION_CANCELLED = "the client cancelled the session's work"


@pytest.mark.duration(10)
async def test_session_cancel_racing_the_clients_own_cancel_answer_always_ends_the_turn_cancelled(
    face: Deployment,
) -> None:
    """Issue 28: a client sends `session/cancel` and its own `cancel` answer to the pending create together. Every
    turn is answered `cancelled` (never `end_turn`), and the elicitation ends cancelled with the cause recorded;
    nothing completes. 20 turns in one session."""
    client = RacingClient()
    async with raw_face(face, client):
        session = await client.new_session()
        for trial in range(20):
            result = await asyncio.wait_for(client.prompt(session), 30)
            assert result == {"stopReason": "cancelled"}, f"trial {trial}: {result}"
            params = await client.next_create()
            record = await face.elicitation(params["elicitationId"])
            assert record is not None and record.status is ElicitationStatus.CANCELLED, trial
            # The cause: the session's cancellation, or (where the answer was taken first) the client's dismissal.
            # The cause recorded: the session's cancellation (session/cancel came first on the wire).
            assert record.failure_reason == SESSION_CANCELLED, (trial, record.failure_reason)
            [cancelled] = await face.store.audit.list(elicitation_id=record.id, event="cancelled")
            assert cancelled.detail.get("cause") == "session_cancel", (trial, cancelled.detail)
        creates = client.received("elicitation/create")
        assert len(creates) == 20
        # A $/cancel_request, where one was sent, names that trial's create and nothing else.
        create_ids = {m["id"] for m in creates}
        assert all(c["params"]["requestId"] in create_ids for c in client.received("$/cancel_request"))
        assert client.received("elicitation/complete") == []


async def test_a_refusal_with_a_reason_is_recorded_refused_with_its_reason(face: Deployment) -> None:
    """A client answering `cancel` with `_meta.message` refuses by its own policy: every face records `refused`
    with the reason (the sidecar faces through `/v1`'s answer), and a plain `cancel` stays a dismissal."""
    reason = "elicitation mode is not supported"
    refusing = RawClient({"action": "cancel", "_meta": {"message": reason}})
    async with raw_face(face, refusing):
        session = await refusing.new_session()
        assert await asyncio.wait_for(refusing.prompt(session), 30) == {"stopReason": "end_turn"}
    [create] = refusing.received("elicitation/create")
    record = await face.elicitation(create["params"]["elicitationId"])
    assert record is not None and record.status is ElicitationStatus.CANCELLED
    assert record.failure_reason == f"client_refused: {reason}"
    events = [(e.event, e.detail.get("client_message")) for e in await face.store.audit.list(elicitation_id=record.id)]
    assert [e for e in events if e[0] != "created"] == [("refused", reason)]
    assert f"the client said: {reason}" in agent_text(refusing)

    dismissing = RawClient({"action": "cancel"})
    async with raw_face(face, dismissing):
        session = await dismissing.new_session()
        assert await asyncio.wait_for(dismissing.prompt(session), 30) == {"stopReason": "end_turn"}
    [create] = dismissing.received("elicitation/create")
    record = await face.elicitation(create["params"]["elicitationId"])
    assert record is not None and record.failure_reason == "dismissed in the client"


@asynccontextmanager
async def restartable_face(
    kind: str, tmp_path: Path, **settings: str
) -> AsyncIterator[tuple[Deployment, RestartableSidecar]]:
    """A sidecar face (`sidecar`: the Python client; `typescript`: the package) on a sidecar of its own that the
    test can kill and start again."""
    if kind == "typescript":
        built_example()
    async with (
        restartable_sidecar(tmp_path, MockOAuthProvider(), **settings) as (sidecar, store, key),
        SidecarClient(sidecar.base_url, key) as client,
    ):
        typescript = (sidecar.base_url, key) if kind == "typescript" else None
        yield Deployment(client, store, sidecar.base_url, ALICE, typescript), sidecar


@pytest.mark.duration(20)
@pytest.mark.parametrize("kind", ["sidecar", "typescript"])
async def test_a_sidecar_restarted_while_the_user_is_at_the_provider_still_completes_once(
    kind: str, tmp_path: Path
) -> None:
    """Issue 28: the sidecar is killed while the user is at the provider and back 1.2 s later. The waiting call
    tries again until it is back; the user's return completes the flow, and the client receives exactly one
    `elicitation/complete` (the embedded face has no sidecar to lose)."""
    async with restartable_face(kind, tmp_path) as (deployment, sidecar):
        client = RawClient({"action": "accept"})
        async with raw_face(deployment, client):
            session = await client.new_session()
            prompt = asyncio.create_task(client.prompt(session))
            params = await client.next_create()
            await eventually(
                lambda: status_is(deployment, params["elicitationId"], ElicitationStatus.CONSENTED),
                "the client's accept is reported",
            )
            async with ScriptedBrowser() as browser:
                page = await browser.get(params["url"])
                to_provider = await browser.submit(page, "continue")
                at_provider = await browser.get(to_provider.headers["location"])  # the user is at the provider
                await sidecar.kill()  # the waiting call's long-poll breaks
                await asyncio.sleep(1.2)
                await sidecar.start()
                final = await browser.follow(at_provider)  # ... and comes back to the restarted sidecar
            assert final.status_code == 200, final.text
            assert await asyncio.wait_for(prompt, 60) == {"stopReason": "end_turn"}
            await client.new_session()  # a round trip: a second completion would have arrived first
            assert [m["params"] for m in client.received("elicitation/complete")] == [
                {"elicitationId": params["elicitationId"]}
            ]
            assert "Your repositories" in agent_text(client)
        record = await deployment.elicitation(params["elicitationId"])
        assert record is not None and record.status is ElicitationStatus.COMPLETED


@pytest.mark.duration(15)
@pytest.mark.parametrize("kind", ["sidecar", "typescript"])
async def test_a_sidecar_down_past_the_expiry_ends_the_turn_with_a_sentence_that_says_so(
    kind: str, tmp_path: Path
) -> None:
    """Issue 28: the sidecar is killed while the user is in the browser and stays down: the waiting call tries
    again until the elicitation's expiry, then the turn ends with a sentence naming what happened (not a bare
    internal error), and nothing completes."""
    async with restartable_face(kind, tmp_path, CONNECTOR_ELICITATION__TTL_SECONDS="5") as (deployment, sidecar):
        client = RawClient({"action": "accept"})
        async with raw_face(deployment, client):
            session = await client.new_session()
            prompt = asyncio.create_task(client.prompt(session))
            params = await client.next_create()
            await eventually(
                lambda: status_is(deployment, params["elicitationId"], ElicitationStatus.CONSENTED),
                "the client's accept is reported",
            )
            await sidecar.kill()
            assert await asyncio.wait_for(prompt, 60) == {"stopReason": "end_turn"}
            said = agent_text(client)
            assert f"The connector at {sidecar.base_url} could not be reached since " in said, said
            assert "the request for access expired at " in said and "the authorization did not complete" in said
            assert client.received("elicitation/complete") == []
