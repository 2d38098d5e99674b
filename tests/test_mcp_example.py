"""The example MCP server (`examples/mcp_server`) under the official MCP Python SDK's client, over stdio and
streamable HTTP, against a real sidecar process, the mock provider over HTTP and a scripted browser.

What the client receives is read from the recorded wire: one URL-mode `elicitation/create` (2025-11-25), exactly one
`notifications/elicitation/complete` to the client that asked and none to another client of the same server, the
`-32042` error and the retry, the input-required round trip (2026-07-28), nothing for a client without URL mode, and
never a token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import httpx2
import pytest
import pytest_asyncio
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from examples.mcp_server.auth import dev_token
from service import Identity
from service.testing import MockOAuthProvider, ScriptedBrowser

from .api_support import make_key
from .chromium_support import CHROMIUM, FLAGS
from .mcp_support import COMPLETE, Asker, McpRun, connected, fresh_tenant, shared_sidecar, text_of
from .sidecar_support import Sidecar, free_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[1]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Sidecar, MockOAuthProvider]]:
    async with shared_sidecar(tmp_path_factory.mktemp("mcp-example")) as both:
        yield both


@pytest_asyncio.fixture(loop_scope="module")
async def sidecar(shared: tuple[Sidecar, MockOAuthProvider]) -> Sidecar:
    return await fresh_tenant(shared, "mcp")


@pytest.fixture
def provider(shared: tuple[Sidecar, MockOAuthProvider]) -> MockOAuthProvider:
    return shared[1]


def server_env(sidecar: Sidecar, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),  # this checkout's code, whatever the editable install points at
        "SIDECAR_URL": sidecar.base_url,
        "SIDECAR_API_KEY": sidecar.api_key,
        "MCP_SERVER_USER_ISSUER": sidecar.local_user.issuer,
        "MCP_SERVER_USER_SUBJECT": sidecar.local_user.subject,
        **extra,
    }


def stdio(sidecar: Sidecar) -> object:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "examples.mcp_server", "stdio"], env=server_env(sidecar), cwd=ROOT
    )
    return stdio_client(params)


async def authorize_in_browser(url: str) -> None:
    async with ScriptedBrowser() as browser:
        final = await browser.authorize(url)
        assert final.status_code == 200, final.text
        assert "You can close this tab" in final.text


def assert_no_secret(run: McpRun, provider: MockOAuthProvider) -> None:
    wire = run.wire.text()
    assert provider.secrets_issued()
    for secret in provider.secrets_issued():
        assert secret not in wire, "a provider secret reached the MCP wire"


@pytest.mark.duration(6)
async def test_stdio_flow_asks_once_waits_for_the_browser_and_completes_once(
    sidecar: Sidecar, provider: MockOAuthProvider
) -> None:
    async with connected(stdio(sidecar), Asker("accept")) as run:
        call = run.call("list_repositories")
        url = await run.asker.next_url()
        await authorize_in_browser(url)
        result = await asyncio.wait_for(call, 120)
        assert not result.is_error and "octocat/hello-world" in text_of(result)
        # Asked again, a stored grant answers at once: nothing more is sent.
        again = await asyncio.wait_for(run.client.call_tool("list_repositories", {}), 120)
        assert "octocat/hello-world" in text_of(again)

    creates = run.wire.received("elicitation/create")
    assert len(creates) == 1
    params = creates[0]["params"]
    assert params["mode"] == "url" and params["url"] == url
    elicitation_id = params["elicitationId"]
    assert url == f"{sidecar.base_url}/connect/{elicitation_id}"
    answers = [m for d, m in run.wire.messages if d == "out" and "method" not in m and m["id"] == creates[0]["id"]]
    assert [a.get("result") for a in answers] == [{"action": "accept"}]
    assert [m["params"] for m in run.wire.received(COMPLETE)] == [{"elicitationId": elicitation_id}]
    assert provider.api_calls.count("/api/user/repos") == 2
    assert_no_secret(run, provider)


@pytest.mark.duration(4)
async def test_stdio_decline_and_cancel_end_it_without_a_completion(
    sidecar: Sidecar, provider: MockOAuthProvider
) -> None:
    asker = Asker("decline")
    async with connected(stdio(sidecar), asker) as run:
        declined = await asyncio.wait_for(run.client.call_tool("list_repositories", {}), 120)
        asker.action = "cancel"
        dismissed = await asyncio.wait_for(run.client.call_tool("list_repositories", {}), 120)
    assert "declined access" in text_of(declined), text_of(declined)
    assert "was dismissed" in text_of(dismissed), text_of(dismissed)
    creates = run.wire.received("elicitation/create")
    assert len(creates) == 2
    states = [await sidecar.store.elicitations.get(c["params"]["elicitationId"]) for c in creates]
    assert [s.status.value if s else None for s in states] == ["declined", "cancelled"]
    assert run.wire.received(COMPLETE) == []
    assert provider.api_calls == []


@pytest.mark.duration(4)
async def test_stdio_client_without_url_mode_is_not_asked(sidecar: Sidecar, provider: MockOAuthProvider) -> None:
    async with connected(stdio(sidecar), Asker("accept"), form_only=True) as run:
        result = await asyncio.wait_for(run.client.call_tool("list_repositories", {}), 120)
    initialize = run.wire.sent("initialize")[0]
    assert initialize["params"]["capabilities"]["elicitation"] == {}  # MCP: form mode only
    assert run.wire.received("elicitation/create") == [] and run.asker.asked == []
    assert "does not support URL-mode elicitation" in text_of(result), text_of(result)
    assert provider.api_calls == []


@pytest.mark.duration(6)
async def test_stdio_url_elicitation_required_error_then_the_clients_retry(
    sidecar: Sidecar, provider: MockOAuthProvider
) -> None:
    async with connected(stdio(sidecar), Asker("accept")) as run:
        with pytest.raises(MCPError) as raised:
            await asyncio.wait_for(run.client.call_tool("list_repositories_after_retry", {}), 120)
        assert raised.value.error.code == -32042
        (elicitation,) = raised.value.error.data["elicitations"]
        assert elicitation["mode"] == "url"
        elicitation_id = elicitation["elicitationId"]
        assert elicitation["url"] == f"{sidecar.base_url}/connect/{elicitation_id}"
        await authorize_in_browser(elicitation["url"])
        for _ in range(200):  # the completion arrives on the connection, outside any request
            if run.wire.received(COMPLETE):
                break
            await asyncio.sleep(0.05)
        retried = await asyncio.wait_for(run.client.call_tool("list_repositories_after_retry", {}), 120)
        assert "octocat/hello-world" in text_of(retried)
    assert run.wire.received("elicitation/create") == [] and run.asker.asked == []
    assert [m["params"] for m in run.wire.received(COMPLETE)] == [{"elicitationId": elicitation_id}]
    assert_no_secret(run, provider)


# -- streamable HTTP, behind MCP's own authorization (a bearer JWT naming the user) ----------------------------------
@dataclass
class HttpServer:
    url: str
    jwks: Path
    log: Path

    def token(self, user: Identity) -> str:
        return dev_token(self.jwks, issuer=user.issuer, audience=self.url, subject=user.subject)

    def transport(self, user: Identity | None) -> object:
        headers = {"Authorization": f"Bearer {self.token(user)}"} if user is not None else {}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
        return streamable_http_client(self.url, http_client=http)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http_server(
    shared: tuple[Sidecar, MockOAuthProvider], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[HttpServer]:
    """The example over streamable HTTP for the module: its bearer tokens come from a key the test holds."""
    sidecar = shared[0]
    folder = tmp_path_factory.mktemp("mcp-http")
    port = free_port()
    server = HttpServer(f"http://127.0.0.1:{port}/mcp", folder / "jwks.json", folder / "server.log")
    server.token(sidecar.local_user)  # makes the key and its JWKS file
    env = server_env(
        dataclasses.replace(sidecar, api_key=await make_key(sidecar.store, tenant="mcp-http")),
        MCP_SERVER_PORT=str(port),
        MCP_SERVER_AUTH_ISSUER=sidecar.local_user.issuer,
        MCP_SERVER_AUTH_JWKS=str(server.jwks),
    )
    with server.log.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "examples.mcp_server", "http", env=env, cwd=ROOT, stdout=log, stderr=log
        )
    try:
        async with httpx.AsyncClient(timeout=2) as probe:
            for _ in range(1200):
                assert process.returncode is None, server.log.read_text()
                with suppress(httpx.HTTPError):
                    if (await probe.post(server.url, json={})).status_code == 401:
                        break
                await asyncio.sleep(0.05)
        yield server
    finally:
        process.terminate()
        await process.wait()


@pytest.mark.duration(6)
async def test_http_flow_completes_once_to_the_asking_client_and_none_to_another(
    sidecar: Sidecar, provider: MockOAuthProvider, http_server: HttpServer
) -> None:
    user = sidecar.local_user
    async with (
        connected(http_server.transport(user), Asker("accept")) as asking,
        connected(http_server.transport(user), Asker("decline")) as other,
    ):
        # The other client was asked too (and declined): the server knows both connections.
        assert "declined access" in text_of(
            await asyncio.wait_for(other.client.call_tool("list_repositories", {}), 120)
        )
        call = asking.call("list_repositories")
        url = await asking.asker.next_url()
        await authorize_in_browser(url)
        result = await asyncio.wait_for(call, 120)
        assert "octocat/hello-world" in text_of(result)
        # The other client of the same server and user: the stored grant answers it without asking.
        answered = await asyncio.wait_for(other.client.call_tool("list_repositories", {}), 120)
        assert "octocat/hello-world" in text_of(answered)
        await asyncio.sleep(0.5)  # time for a stray notification to arrive, if one were sent
    (create,) = asking.wire.received("elicitation/create")
    elicitation_id = create["params"]["elicitationId"]
    assert [m["params"] for m in asking.wire.received(COMPLETE)] == [{"elicitationId": elicitation_id}]
    assert other.wire.received(COMPLETE) == [] and len(other.wire.received("elicitation/create")) == 1
    assert_no_secret(asking, provider)
    assert_no_secret(other, provider)
    for run in (asking, other):
        assert http_server.token(user).split(".")[2] not in run.wire.text()  # nor the bearer itself


@pytest.mark.duration(6)
async def test_http_browser_of_another_user_is_refused(sidecar: Sidecar, http_server: HttpServer) -> None:
    """The bearer names Bob; the person in the browser is the sidecar's local user (Alice): refused."""
    bob = Identity(sidecar.local_user.issuer, "bob")
    async with connected(http_server.transport(bob), Asker("accept")) as run:
        call = run.call("list_repositories")
        url = await run.asker.next_url()
        async with ScriptedBrowser() as browser:
            page = await browser.get(url)
            refused = await browser.submit(page, "continue")
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "identity_mismatch"
        call.cancel()
        with suppress(asyncio.CancelledError):
            await call
    elicitation_id = run.wire.received("elicitation/create")[0]["params"]["elicitationId"]
    record = await sidecar.store.elicitations.get(elicitation_id)
    assert record is not None and record.identity == bob and record.status.value != "completed"
    assert await sidecar.store.grants.find(bob, "github") == []
    assert run.wire.received(COMPLETE) == []


async def test_http_without_a_verified_bearer_is_refused(sidecar: Sidecar, http_server: HttpServer) -> None:
    user = sidecar.local_user
    other_audience = dev_token(http_server.jwks, issuer=user.issuer, audience="http://elsewhere/mcp", subject="alice")
    other_issuer = dev_token(
        http_server.jwks, issuer="https://elsewhere.example.com", audience=http_server.url, subject="alice"
    )
    expired = dev_token(http_server.jwks, issuer=user.issuer, audience=http_server.url, subject="alice", seconds=-60)
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx.AsyncClient() as plain:
        for headers in [{}, *({"Authorization": f"Bearer {t}"} for t in (other_audience, other_issuer, expired))]:
            answer = await plain.post(http_server.url, json=listing, headers=headers)
            assert answer.status_code == 401, headers
            assert answer.headers["www-authenticate"].startswith("Bearer")


# -- 2026-07-28: the input-required round trip (no server-to-client request, no completion notification) -------------
MODERN = "2026-07-28"


def input_required_results(run: McpRun) -> list[dict[str, object]]:
    return [
        m["result"]
        for d, m in run.wire.messages
        if d == "in" and isinstance(m.get("result"), dict) and m["result"].get("resultType") == "input_required"
    ]


@pytest.mark.duration(6)
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_2026_round_trip_asks_in_the_result_and_the_retry_waits_for_the_browser(
    sidecar: Sidecar, provider: MockOAuthProvider, http_server: HttpServer, transport: str
) -> None:
    user = sidecar.local_user
    connection = stdio(sidecar) if transport == "stdio" else http_server.transport(user)
    async with connected(connection, Asker("accept"), mode=MODERN) as run:
        assert run.client.protocol_version == MODERN
        call = run.call("list_repositories")
        url = await run.asker.next_url()
        await authorize_in_browser(url)
        result = await asyncio.wait_for(call, 120)
        assert "octocat/hello-world" in text_of(result)
    (asked,) = run.asker.asked
    assert asked == {"mode": "url", "message": asked["message"], "url": url}  # no elicitationId at 2026-07-28
    (question,) = input_required_results(run)
    assert question["inputRequests"] == {"authorization": {"method": "elicitation/create", "params": asked}}
    retries = [m for m in run.wire.sent("tools/call") if "inputResponses" in m["params"]]
    assert [r["params"]["inputResponses"] for r in retries] == [{"authorization": {"action": "accept"}}]
    assert retries[0]["params"]["requestState"]
    assert run.wire.received("elicitation/create") == [] and run.wire.received(COMPLETE) == []
    assert_no_secret(run, provider)


@pytest.mark.duration(6)
async def test_2026_decline_the_retry_tool_and_a_client_without_url_mode(
    sidecar: Sidecar, provider: MockOAuthProvider, http_server: HttpServer
) -> None:
    user = sidecar.local_user
    async with connected(http_server.transport(user), Asker("decline"), mode=MODERN) as run:
        declined = await asyncio.wait_for(run.client.call_tool("list_repositories", {}), 120)
        # Where -32042 no longer exists, the retry tool asks with the same round trip.
        again = await asyncio.wait_for(run.client.call_tool("list_repositories_after_retry", {}), 120)
    assert "declined access" in text_of(declined) and "declined access" in text_of(again)
    assert len(input_required_results(run)) == 2
    assert [e.get("error") for d, e in run.wire.messages if d == "in" and "error" in e] == []
    async with connected(http_server.transport(user), Asker("accept"), mode=MODERN, form_only=True) as form_only:
        unsupported = await asyncio.wait_for(form_only.client.call_tool("list_repositories", {}), 120)
    assert "does not support URL-mode elicitation" in text_of(unsupported)
    assert input_required_results(form_only) == [] and form_only.asker.asked == []
    assert provider.api_calls == []


# -- the browser step in a real browser (Debian's Chromium driven by Playwright) -----------------------------------


@pytest.mark.duration(10)
async def test_http_flow_with_the_browser_step_in_chromium(
    sidecar: Sidecar, provider: MockOAuthProvider, http_server: HttpServer
) -> None:
    playwright_api = pytest.importorskip("playwright.async_api", reason="Playwright (pip package) is not installed")
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"the real-browser run needs Debian's chromium at {CHROMIUM}")
    async with connected(http_server.transport(sidecar.local_user), Asker("accept")) as run:
        call = run.call("list_repositories")
        url = await run.asker.next_url()
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = await browser.new_page()
            response = await page.goto(url)
            assert response is not None and response.status == 200
            await page.get_by_role("button", name="Continue to Mock Provider").click()
            await page.wait_for_load_state()
            assert await page.locator("h1").inner_text() == "Connected"
            await browser.close()
        result = await asyncio.wait_for(call, 120)
        assert "octocat/hello-world" in text_of(result)
    (create,) = run.wire.received("elicitation/create")
    assert [m["params"] for m in run.wire.received(COMPLETE)] == [{"elicitationId": create["params"]["elicitationId"]}]
    assert_no_secret(run, provider)
