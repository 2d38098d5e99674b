"""The TypeScript example MCP server (`examples/mcp_ts_server`, on the official `@modelcontextprotocol/sdk` from npm)
under the official TypeScript SDK's client (`src/client.ts`), through a real sidecar's /v1 API, the mock provider
over HTTP and a scripted browser: asked once with URL mode and told the completion once (2025-11-25), decline, a
client without URL mode (`elicitation: {}` is form only), the -32042 error and the client's retry, and no token on the
MCP wire (every message, both ways, scanned)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from service.testing import MockOAuthProvider, ScriptedBrowser

from .mcp_support import fresh_tenant, shared_sidecar
from .sidecar_support import Sidecar

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mcp_ts_server"
COMPLETE = "notifications/elicitation/complete"


@pytest.fixture(scope="module")
def built() -> Path:
    """`npm ci` and `tsc`, once per change of the lock file or the sources."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("the TypeScript example needs Node.js 20+ and npm")
    stamp = EXAMPLE / ".installed"
    inputs = [EXAMPLE / "package-lock.json", EXAMPLE / "tsconfig.json", *sorted((EXAMPLE / "src").glob("*.ts"))]
    with (EXAMPLE / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        newest = max(path.stat().st_mtime for path in inputs)
        if not stamp.exists() or stamp.stat().st_mtime < newest or not (EXAMPLE / "dist" / "client.js").exists():
            for command in (["npm", "ci", "--no-audit", "--no-fund"], ["npx", "tsc", "-p", "."]):
                subprocess.run(command, cwd=EXAMPLE, check=True, capture_output=True, timeout=600)
            stamp.touch()
    return EXAMPLE / "dist" / "client.js"


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


@dataclass
class Run:
    events: list[dict[str, Any]] = field(default_factory=list)
    wire: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def received(self, method: str) -> list[dict[str, Any]]:
        return [w["message"] for w in self.wire if w["direction"] == "in" and w["message"].get("method") == method]


async def run_client(
    built: Path, sidecar: Sidecar, tmp_path: Path, tool: str, action: str, *flags: str, browser: bool = True
) -> Run:
    """The TS client (which starts the TS server) until it exits; the browser authorizes each URL it reports."""
    wire_log = tmp_path / f"wire-{uuid.uuid4().hex[:8]}.jsonl"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "SIDECAR_URL": sidecar.base_url,
        "SIDECAR_API_KEY": sidecar.api_key,
        "MCP_SERVER_USER_ISSUER": sidecar.local_user.issuer,
        "MCP_SERVER_USER_SUBJECT": sidecar.local_user.subject,
        "WIRE_LOG": str(wire_log),
    }
    process = await asyncio.create_subprocess_exec(
        "node", str(built), tool, action, *flags, cwd=EXAMPLE, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    run = Run()
    async with asyncio.timeout(300):
        while line := await process.stdout.readline():
            event = json.loads(line)
            run.events.append(event)
            url = event.get("params", {}).get("url") or next(
                (e["url"] for e in event.get("data", {}).get("elicitations", [])), None
            )
            if url and browser and (event["event"] == "url_required" or action == "accept"):
                async with ScriptedBrowser() as scripted:
                    final = await scripted.authorize(url)
                    assert final.status_code == 200, final.text
        run.stderr = (await process.stderr.read()).decode(errors="replace")
        assert await process.wait() == 0, run.stderr
    run.wire = [json.loads(line) for line in wire_log.read_text().splitlines()]
    return run


def assert_no_secret(run: Run, provider: MockOAuthProvider) -> None:
    wire = json.dumps(run.wire)
    assert provider.secrets_issued()
    for secret in provider.secrets_issued():
        assert secret not in wire and secret not in json.dumps(run.events), "a provider secret reached the MCP wire"


@pytest.mark.duration(8)
async def test_ts_flow_asks_once_and_completes_once(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, tmp_path: Path
) -> None:
    run = await run_client(built, sidecar, tmp_path, "list_repositories", "accept")
    (asked,) = run.of("elicitation")
    params = asked["params"]
    assert params["mode"] == "url" and params["url"] == f"{sidecar.base_url}/connect/{params['elicitationId']}"
    assert [e["elicitationId"] for e in run.of("complete")] == [params["elicitationId"]]
    assert [m["params"] for m in run.received(COMPLETE)] == [{"elicitationId": params["elicitationId"]}]
    assert "octocat/hello-world" in run.of("result")[0]["text"]
    assert len(run.received("elicitation/create")) == 1
    assert_no_secret(run, provider)
    # Asked again by a new client (a new connection), the stored grant answers without asking.
    again = await run_client(built, sidecar, tmp_path, "list_repositories", "accept")
    assert again.of("elicitation") == [] and again.received(COMPLETE) == []
    assert "octocat/hello-world" in again.of("result")[0]["text"]


@pytest.mark.duration(6)
async def test_ts_decline_and_a_client_without_url_mode(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, tmp_path: Path
) -> None:
    declined = await run_client(built, sidecar, tmp_path, "list_repositories", "decline")
    assert len(declined.of("elicitation")) == 1 and declined.received(COMPLETE) == []
    assert "declined" in declined.of("result")[0]["text"]
    form_only = await run_client(built, sidecar, tmp_path, "list_repositories", "accept", "--form-only")
    initialize = next(w["message"] for w in form_only.wire if w["message"].get("method") == "initialize")
    assert initialize["params"]["capabilities"]["elicitation"] == {}
    assert form_only.received("elicitation/create") == []
    assert "unsupported" in form_only.of("result")[0]["text"]
    assert provider.api_calls == []


@pytest.mark.duration(8)
async def test_ts_url_elicitation_required_then_the_clients_retry(
    built: Path, sidecar: Sidecar, provider: MockOAuthProvider, tmp_path: Path
) -> None:
    run = await run_client(built, sidecar, tmp_path, "list_repositories_after_retry", "accept")
    (required,) = run.of("url_required")
    (elicitation,) = required["data"]["elicitations"]
    assert elicitation["mode"] == "url"
    errors = [w["message"]["error"] for w in run.wire if "error" in w["message"]]
    assert [e["code"] for e in errors] == [-32042]
    assert [m["params"] for m in run.received(COMPLETE)] == [{"elicitationId": elicitation["elicitationId"]}]
    assert "octocat/hello-world" in run.of("result")[0]["text"]
    assert run.received("elicitation/create") == []
    assert_no_secret(run, provider)
