"""The TypeScript example MCP server (`examples/mcp_ts_server`, on the official `@modelcontextprotocol/sdk` 1.x from
npm, with `@acp-connector/client/mcp`) under the official TypeScript SDK's client (`src/client.ts`), through a real
sidecar's /v1 API and the mock provider over HTTP, over stdio and streamable HTTP (behind a verified bearer).

What the client receives is read from its recorded wire (every message, both ways): one URL-mode
`elicitation/create` and exactly one `notifications/elicitation/complete` to the client that asked, none to another
client of the same server process; decline and cancel; nothing for a client without URL mode (`elicitation: {}` is
form only); the -32042 error and the client's retry; the bearer's user checked on the connect page (another person in
the browser is refused); a browser step in real Chromium; and never a token. The 2026-07-28 input-required round
trip runs on the SDK's v2 packages (`src/modern.ts` under `src/modern-client.ts`), since 1.x has no 2026-07-28.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from examples.mcp_server.auth import dev_token
from service import Identity
from service.testing import MockOAuthProvider, ScriptedBrowser

from .api_support import make_key
from .chromium_support import CHROMIUM, FLAGS
from .mcp_support import fresh_tenant, shared_sidecar
from .sidecar_support import Sidecar, free_port
from .ts_support import MCP_EXAMPLE, built_example

pytestmark = pytest.mark.asyncio(loop_scope="module")

COMPLETE = "notifications/elicitation/complete"
EVENT_SECONDS = 120  # hang guard only: no timing is asserted


@pytest.fixture(scope="module")
def built() -> Path:
    """The package and the example, built once per change (`npm ci`, `tsc`)."""
    return built_example(MCP_EXAMPLE, "client.js")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Sidecar, MockOAuthProvider]]:
    async with shared_sidecar(tmp_path_factory.mktemp("mcp-ts")) as both:
        yield both


@pytest_asyncio.fixture(loop_scope="module")
async def sidecar(shared: tuple[Sidecar, MockOAuthProvider]) -> Sidecar:
    return await fresh_tenant(shared, "mcp-ts")


@pytest.fixture
def provider(shared: tuple[Sidecar, MockOAuthProvider]) -> MockOAuthProvider:
    return shared[1]


def server_env(sidecar: Sidecar, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "SIDECAR_URL": sidecar.base_url,
        "SIDECAR_API_KEY": sidecar.api_key,
        "MCP_SERVER_USER_ISSUER": sidecar.local_user.issuer,
        "MCP_SERVER_USER_SUBJECT": sidecar.local_user.subject,
        **extra,
    }


@dataclass
class TsClient:
    """One run of the example's TS client: its JSON-line events as they come, and its wire once it has exited."""

    process: asyncio.subprocess.Process
    wire_log: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    wire: list[dict[str, Any]] = field(default_factory=list)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.events.append(json.loads(line))
            self._arrived.set()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    async def next(self, kind: str, count: int = 1) -> dict[str, Any]:
        """The `count`-th event of `kind`, once it has come."""
        async with asyncio.timeout(EVENT_SECONDS):
            while len(self.of(kind)) < count:
                assert self._reader is not None and not self._reader.done(), await self.stderr()
                self._arrived.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), 1)
        return self.of(kind)[count - 1]

    def resume(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")

    async def stderr(self) -> str:
        assert self.process.stderr is not None
        return (
            (await self.process.stderr.read()).decode(errors="replace") if self.process.returncode is not None else ""
        )

    async def finish(self) -> TsClient:
        async with asyncio.timeout(EVENT_SECONDS):
            assert self._reader is not None
            await self._reader
            code = await self.process.wait()
        assert code == 0, await self.stderr()
        self.load_wire()
        return self

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        if self._reader is not None:
            self._reader.cancel()
            with suppress(asyncio.CancelledError):
                await self._reader
        self.load_wire()

    def load_wire(self) -> None:
        text = self.wire_log.read_text() if self.wire_log.exists() else ""
        self.wire = [json.loads(line) for line in text.splitlines()]

    def received(self, method: str) -> list[dict[str, Any]]:
        return [w["message"] for w in self.wire if w["direction"] == "in" and w["message"].get("method") == method]

    def sent(self, method: str) -> list[dict[str, Any]]:
        return [w["message"] for w in self.wire if w["direction"] == "out" and w["message"].get("method") == method]


async def start_client(
    built: Path,
    env: dict[str, str],
    tmp_path: Path,
    *steps: str,
    http: str | None = None,
    bearer: str | None = None,
    script: str = "client.js",
) -> TsClient:
    """The TS client running `steps` (over stdio it starts the TS server with `env`; over `http` it connects).
    `script`: `modern-client.js` for the SDK v2 client pinned to 2026-07-28 (it starts `modern.js`)."""
    wire_log = tmp_path / f"wire-{uuid.uuid4().hex[:8]}.jsonl"
    env = {**env, "WIRE_LOG": str(wire_log), **({"MCP_BEARER": bearer} if bearer else {})}
    args = [*(["--http", http] if http else []), *steps]
    process = await asyncio.create_subprocess_exec(
        "node", str(built.parent / script), *args, cwd=MCP_EXAMPLE, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    client = TsClient(process, wire_log)
    client._reader = asyncio.create_task(client._read())
    return client


async def authorize_in_browser(url: str) -> None:
    async with ScriptedBrowser() as browser:
        final = await browser.authorize(url)
        assert final.status_code == 200, final.text
        assert "You can close this tab" in final.text


def assert_no_secret(client: TsClient, provider: MockOAuthProvider, *more: str) -> None:
    wire = json.dumps(client.wire) + json.dumps(client.events)
    assert provider.secrets_issued()
    for secret in [*provider.secrets_issued(), *more]:
        assert secret not in wire, "a secret reached the MCP wire"


def elicitation_url(client: TsClient) -> str:
    return str(client.of("elicitation")[0]["params"]["url"])


# -- stdio: the one local user this server process runs for ---------------------------------------------------------


@pytest.mark.duration(8)
async def test_ts_stdio_flow_asks_once_and_completes_once(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, tmp_path: Path
) -> None:
    client = await start_client(built, server_env(sidecar), tmp_path, "list_repositories:accept")
    asked = await client.next("elicitation")
    await authorize_in_browser(asked["params"]["url"])
    await client.finish()
    params = asked["params"]
    assert params["mode"] == "url" and params["url"] == f"{sidecar.base_url}/connect/{params['elicitationId']}"
    (create,) = client.received("elicitation/create")
    assert create["params"] == params
    out = [w["message"] for w in client.wire if w["direction"] == "out" and "method" not in w["message"]]
    answers = [m for m in out if m["id"] == create["id"]]
    assert [a.get("result") for a in answers] == [{"action": "accept"}]
    assert [m["params"] for m in client.received(COMPLETE)] == [{"elicitationId": params["elicitationId"]}]
    assert "octocat/hello-world" in client.of("result")[0]["text"]
    assert_no_secret(client, provider)
    # Asked again by a new client (a new connection), the stored grant answers without asking.
    again = await (await start_client(built, server_env(sidecar), tmp_path, "list_repositories")).finish()
    assert again.of("elicitation") == [] and again.received(COMPLETE) == []
    assert "octocat/hello-world" in again.of("result")[0]["text"]


@pytest.mark.duration(8)
async def test_ts_decline_cancel_and_a_client_without_url_mode(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, tmp_path: Path
) -> None:
    steps = ("list_repositories:decline", "list_repositories:cancel")
    client = await (await start_client(built, server_env(sidecar), tmp_path, *steps)).finish()
    declined, dismissed = (r["text"] for r in client.of("result"))
    assert "declined access" in declined, declined
    assert "was dismissed" in dismissed, dismissed
    creates = client.received("elicitation/create")
    assert len(creates) == 2 and client.received(COMPLETE) == []
    states = [await sidecar.store.elicitations.get(c["params"]["elicitationId"]) for c in creates]
    assert [s.status.value if s else None for s in states] == ["declined", "cancelled"]

    form_only = await (
        await start_client(built, server_env(sidecar), tmp_path, "--form-only", "list_repositories")
    ).finish()
    (initialize,) = form_only.sent("initialize")
    assert initialize["params"]["capabilities"]["elicitation"] == {}  # MCP: form mode only
    assert form_only.received("elicitation/create") == []
    assert "does not support URL-mode elicitation" in form_only.of("result")[0]["text"]
    assert provider.api_calls == []


# -- streamable HTTP, behind MCP's own authorization (a bearer JWT naming the user) ----------------------------------
@dataclass
class HttpServer:
    url: str
    jwks: Path
    log: Path
    env: dict[str, str]

    def token(self, user: Identity) -> str:
        return dev_token(self.jwks, issuer=user.issuer, audience=self.url, subject=user.subject)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http_server(
    built: Path, shared: tuple[Sidecar, MockOAuthProvider], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[HttpServer]:
    """The TS example on streamable HTTP for the module (one process, every client's session in it)."""
    sidecar = dataclasses.replace(shared[0], api_key=await make_key(shared[0].store, tenant="mcp-ts-http"))
    folder = tmp_path_factory.mktemp("mcp-ts-http")
    port = free_port()
    server = HttpServer(f"http://127.0.0.1:{port}/mcp", folder / "jwks.json", folder / "server.log", {})
    server.token(sidecar.local_user)  # makes the key and its JWKS file
    server.env = server_env(
        sidecar,
        MCP_SERVER_PORT=str(port),
        MCP_SERVER_AUTH_ISSUER=sidecar.local_user.issuer,
        MCP_SERVER_AUTH_JWKS=str(server.jwks),
    )
    with server.log.open("ab") as log:
        script = str(MCP_EXAMPLE / "dist" / "server.js")
        process = await asyncio.create_subprocess_exec(
            "node", script, "http", env=server.env, cwd=MCP_EXAMPLE, stdout=log, stderr=log
        )  # fmt: skip
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


@pytest.mark.duration(10)
async def test_ts_http_completes_once_to_the_asking_client_and_none_to_another(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, http_server: HttpServer, tmp_path: Path
) -> None:
    bearer = http_server.token(sidecar.local_user)
    env = {"PATH": os.environ.get("PATH", "")}
    other = await start_client(
        built, env, tmp_path, "list_repositories:decline", "pause", "list_repositories", "pause",
        http=http_server.url, bearer=bearer,
    )  # fmt: skip
    assert "declined access" in (await other.next("result"))["text"]  # asked too, and declined: a known connection
    await other.next("paused")
    asking = await start_client(built, env, tmp_path, "list_repositories:accept", http=http_server.url, bearer=bearer)
    asked = await asking.next("elicitation")
    await authorize_in_browser(asked["params"]["url"])
    await asking.finish()
    assert "octocat/hello-world" in asking.of("result")[0]["text"]
    other.resume()  # the other client of the same server and user: the stored grant answers it without asking
    assert "octocat/hello-world" in (await other.next("result", 2))["text"]
    await other.next("paused", 2)
    await asyncio.sleep(0.5)  # time for a stray notification to arrive, if one were sent
    other.resume()
    await other.finish()

    elicitation_id = asked["params"]["elicitationId"]
    assert [m["params"] for m in asking.received(COMPLETE)] == [{"elicitationId": elicitation_id}]
    assert asking.of("complete") == [{"event": "complete", "elicitationId": elicitation_id}]
    assert other.received(COMPLETE) == [] and other.of("complete") == []
    assert len(other.received("elicitation/create")) == 1
    for client in (asking, other):
        assert_no_secret(client, provider, bearer.split(".")[2])  # nor the bearer itself


@pytest.mark.duration(8)
async def test_ts_http_browser_of_another_user_is_refused(
    built: Path, sidecar: Sidecar, http_server: HttpServer, tmp_path: Path
) -> None:
    """The bearer names Bob; the person in the browser is the sidecar's local user (Alice): refused."""
    bob = Identity(sidecar.local_user.issuer, "bob")
    env = {"PATH": os.environ.get("PATH", "")}
    client = await start_client(
        built, env, tmp_path, "list_repositories", http=http_server.url, bearer=http_server.token(bob)
    )
    url = (await client.next("elicitation"))["params"]["url"]
    async with ScriptedBrowser() as browser:
        page = await browser.get(url)
        refused = await browser.submit(page, "continue")
    assert refused.status_code == 403
    assert refused.headers["X-Connector-Error"] == "identity_mismatch"
    await client.kill()
    elicitation_id = client.of("elicitation")[0]["params"]["elicitationId"]
    record = await sidecar.store.elicitations.get(elicitation_id)
    assert record is not None and record.identity == bob and record.status.value != "completed"
    assert await sidecar.store.grants.find(bob, "github") == []
    assert client.received(COMPLETE) == [] and client.of("result") == []


async def test_ts_http_without_a_verified_bearer_is_refused(sidecar: Sidecar, http_server: HttpServer) -> None:
    user = sidecar.local_user
    jwks, url = http_server.jwks, http_server.url
    other_audience = dev_token(jwks, issuer=user.issuer, audience="http://elsewhere/mcp", subject="alice")
    other_issuer = dev_token(jwks, issuer="https://elsewhere.example.com", audience=url, subject="alice")
    expired = dev_token(jwks, issuer=user.issuer, audience=url, subject="alice", seconds=-60)
    initialize = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }  # fmt: skip
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient() as plain:
        for bearer in [None, "not-a-jwt", other_audience, other_issuer, expired]:
            auth = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            answer = await plain.post(url, json=initialize, headers=headers | auth)
            assert answer.status_code == 401, bearer
            assert answer.headers["www-authenticate"].startswith("Bearer")
        # The same request with a good bearer opens a session; another user's bearer cannot use it.
        opened = await plain.post(
            url, json=initialize, headers=headers | {"Authorization": f"Bearer {http_server.token(user)}"}
        )
        assert opened.status_code == 200, opened.text
        session = {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
        bob = http_server.token(Identity(user.issuer, "bob"))
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        taken = await plain.post(url, json=listing, headers=headers | session | {"Authorization": f"Bearer {bob}"})
        assert taken.status_code == 403


# -- -32042, over both transports --------------------------------------------------------------------------------------


@pytest.mark.duration(8)
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_ts_url_elicitation_required_then_the_clients_retry(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, http_server: HttpServer, tmp_path: Path, transport: str
) -> None:
    step = "list_repositories_after_retry"
    if transport == "stdio":
        client = await start_client(built, server_env(sidecar), tmp_path, step)
    else:
        bearer = http_server.token(sidecar.local_user)
        env = {"PATH": os.environ.get("PATH", "")}
        client = await start_client(built, env, tmp_path, step, http=http_server.url, bearer=bearer)
    required = await client.next("url_required")
    (elicitation,) = required["data"]["elicitations"]
    assert elicitation["mode"] == "url"
    assert elicitation["url"].startswith(f"{sidecar.base_url}/connect/")
    await authorize_in_browser(elicitation["url"])
    await client.finish()
    errors = [w["message"]["error"] for w in client.wire if "error" in w["message"]]
    assert [e["code"] for e in errors] == [-32042]
    assert errors[0]["data"] == required["data"]
    assert [m["params"] for m in client.received(COMPLETE)] == [{"elicitationId": elicitation["elicitationId"]}]
    assert len(client.sent("tools/call")) == 2  # the call and the client's retry, which the grant answers
    assert "octocat/hello-world" in client.of("result")[0]["text"]
    assert client.received("elicitation/create") == []
    assert_no_secret(client, provider)


# -- the browser step in a real browser (Debian's Chromium driven by Playwright) -----------------------------------


@pytest.mark.duration(12)
async def test_ts_http_flow_with_the_browser_step_in_chromium(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, http_server: HttpServer, tmp_path: Path
) -> None:
    playwright_api = pytest.importorskip("playwright.async_api", reason="Playwright (pip package) is not installed")
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"the real-browser run needs Debian's chromium at {CHROMIUM}")
    bearer = http_server.token(sidecar.local_user)
    env = {"PATH": os.environ.get("PATH", "")}
    client = await start_client(built, env, tmp_path, "list_repositories:accept", http=http_server.url, bearer=bearer)
    url = (await client.next("elicitation"))["params"]["url"]
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = await browser.new_page()
        response = await page.goto(url)
        assert response is not None and response.status == 200
        await page.get_by_role("button", name="Continue to Mock Provider").click()
        await page.wait_for_load_state()
        assert await page.locator("h1").inner_text() == "Connected"
        await browser.close()
    await client.finish()
    assert "octocat/hello-world" in client.of("result")[0]["text"]
    (create,) = client.received("elicitation/create")
    assert [m["params"] for m in client.received(COMPLETE)] == [{"elicitationId": create["params"]["elicitationId"]}]
    assert_no_secret(client, provider, bearer.split(".")[2])


# -- 2026-07-28: the input-required round trip, on the official SDK's v2 packages -----------------------------------


def input_required(client: TsClient) -> list[dict[str, Any]]:
    return [
        w["message"]["result"]
        for w in client.wire
        if w["direction"] == "in" and (w["message"].get("result") or {}).get("resultType") == "input_required"
    ]


@pytest.mark.duration(8)
async def test_ts_2026_round_trip_asks_in_the_result_and_the_retry_waits_for_the_browser(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, tmp_path: Path
) -> None:
    client = await start_client(built, server_env(sidecar), tmp_path, "list_repositories", script="modern-client.js")
    assert (await client.next("connected"))["era"] == "modern"
    asked = await client.next("elicitation")
    await authorize_in_browser(asked["params"]["url"])
    await client.finish()
    assert "octocat/hello-world" in client.of("result")[0]["text"]
    params = asked["params"]
    assert params == {"mode": "url", "message": params["message"], "url": params["url"]}  # no elicitationId
    assert params["url"].startswith(f"{sidecar.base_url}/connect/")
    (question,) = input_required(client)
    assert question["inputRequests"] == {"authorization": {"method": "elicitation/create", "params": params}}
    calls = client.sent("tools/call")
    assert [c["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] for c in calls] == ["2026-07-28"] * 2
    (retry,) = [c for c in calls if "inputResponses" in c["params"]]
    assert retry["params"]["inputResponses"] == {"authorization": {"action": "accept"}}
    assert retry["params"]["requestState"] == question["requestState"]
    assert client.received("elicitation/create") == [] and client.received(COMPLETE) == []
    assert_no_secret(client, provider)


@pytest.mark.duration(8)
async def test_ts_2026_decline_and_a_client_without_url_mode(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, tmp_path: Path
) -> None:
    steps = ("list_repositories:decline", "list_repositories_after_retry:cancel")
    client = await (
        await start_client(built, server_env(sidecar), tmp_path, *steps, script="modern-client.js")
    ).finish()
    declined, dismissed = (r["text"] for r in client.of("result"))
    assert "declined access" in declined and "was dismissed" in dismissed
    assert len(input_required(client)) == 2
    assert [w for w in client.wire if w["direction"] == "in" and "error" in w["message"]] == []
    form_only = await (
        await start_client(built, server_env(sidecar), tmp_path, "--form-only", script="modern-client.js")
    ).finish()
    assert "does not support URL-mode elicitation" in form_only.of("result")[0]["text"]
    assert input_required(form_only) == [] and form_only.of("elicitation") == []
    assert provider.api_calls == []
