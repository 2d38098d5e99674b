"""The benchmarks' side of a connect flow: an SDK client that accepts elicitations, and browsers that finish them.

`AgentDriver.flow` runs one whole flow, as a user of its own, against the benchmark agent (bench/agent.py):
`session/prompt` -> `elicitation/create` (accepted) -> consent page -> Continue -> the provider's authorize -> the
callback -> the prompt ends, with `elicitation/complete` noted by the client. `Baseline.flow` runs the baseline
app's flow. `run_flows` runs many, a fixed number at a time, one browser (keep-alive connections, fresh cookies)
per worker.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import httpx
from acp import text_block
from acp.client.connection import ClientSideConnection
from acp.schema import AcceptElicitationResponse

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
ACTION = re.compile(r'<form method="post" action="([^"]+)"')
TLS = ssl.create_default_context()  # one for every browser: building one per client costs ~20 ms of CPU

# Each flow runs as a user of its own, named by the flow (the trusted_header verifier; the driver's loopback peer
# plays the authenticating proxy), so no flow finds a grant an earlier one stored. With one user for the whole run,
# each flow would ask for the union of every earlier flow's scopes (incremental authorization): its elicitation, its
# consent page and its authorize URL would grow with the run, and so would CPU and memory per flow.
USER_ISSUER = "https://bench.example"
USER_HEADER = "X-Forwarded-User"
PER_FLOW_USERS = {
    "CONNECTOR_IDENTITY__VERIFIER": "trusted_header",
    "CONNECTOR_IDENTITY__TRUSTED_HEADER__ISSUER": USER_ISSUER,
    "CONNECTOR_SERVER__TRUSTED_PROXIES": "127.0.0.1/32",
}


@dataclass
class Flow:
    name: str
    url: asyncio.Future[str]
    elicitation_id: str | None = None
    completions: list[float] = field(default_factory=list)  # when elicitation/complete arrived (more than 1: dup)
    callback_sent: float | None = None
    callback_answered: float | None = None


class BenchClient:
    """An SDK client that accepts every URL elicitation and notes when each `elicitation/complete` arrives."""

    def __init__(self) -> None:
        self.flows: dict[str, Flow] = {}  # by tool call id
        self.by_elicitation: dict[str, Flow] = {}
        self.unknown_completions = 0

    def expect(self, name: str) -> Flow:
        flow = Flow(name, asyncio.get_running_loop().create_future())
        self.flows[f"call-{name}"] = flow
        return flow

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        flow = self.flows.get(getattr(mode, "tool_call_id", None) or "")
        if flow is not None:
            flow.elicitation_id = mode.elicitation_id
            self.by_elicitation[mode.elicitation_id] = flow
            flow.url.set_result(str(mode.url))
        return AcceptElicitationResponse(action="accept")

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        now = time.perf_counter()
        flow = self.by_elicitation.get(elicitation_id)
        if flow is None:
            self.unknown_completions += 1
        else:
            flow.completions.append(now)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None

    def on_connect(self, conn: Any) -> None:
        return None


@dataclass
class Result:
    flows: int = 0
    errors: int = 0
    seconds: float = 0.0
    lost: int = 0
    duplicated: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    after_response_ms: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.flows / self.seconds if self.seconds else 0.0

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(what)


class AgentDriver:
    """Whole flows against the benchmark agent, through its SDK connection and the browsers."""

    def __init__(self, conn: ClientSideConnection, client: BenchClient, pid: int | None = None) -> None:
        self.conn = conn
        self.client = client
        self.pid = pid  # the agent's process, when it runs in one of its own
        self.sessions: list[str] = []

    async def session(self, index: int) -> str:
        while len(self.sessions) <= index:
            self.sessions.append((await self.conn.new_session(cwd="/", mcp_servers=[])).session_id)
        return self.sessions[index]

    async def flow(self, browser: httpx.AsyncClient, worker: int, result: Result) -> None:
        name = f"flow-{uuid.uuid4().hex[:12]}"  # the user and the scope asked for: no stored grant covers it
        flow = self.client.expect(name)
        browser.headers[USER_HEADER] = name
        session = await self.session(worker)
        prompt = asyncio.create_task(self.conn.prompt(session_id=session, prompt=[text_block(name)]))
        try:
            url = await asyncio.wait_for(flow.url, 60)
            page = await browser.get(url)
            if page.status_code != 200:
                return result.error(f"consent page {page.status_code}")
            token, action = CSRF.search(page.text), ACTION.search(page.text)
            if token is None or action is None:
                return result.error("consent page without its form")
            form = {"csrf": token.group(1), "action": "continue"}
            answer = await browser.post(urljoin(url, action.group(1)), data=form)
            if answer.status_code != 303:
                return result.error(f"continue {answer.status_code}")
            at_provider = await browser.get(answer.headers["location"])
            if at_provider.status_code != 302:
                return result.error(f"authorize {at_provider.status_code}")
            flow.callback_sent = time.perf_counter()
            callback = await browser.get(at_provider.headers["location"])
            flow.callback_answered = time.perf_counter()
            if callback.status_code != 303:
                return result.error(f"callback {callback.status_code}")
            done = await browser.get(urljoin(url, callback.headers["location"]))  # the page the browser lands on
            if done.status_code != 200:
                return result.error(f"connected page {done.status_code}")
            ended = await asyncio.wait_for(prompt, 60)
            if ended.stop_reason != "end_turn":
                return result.error(f"prompt ended {ended.stop_reason}")
            result.flows += 1
        except Exception as exc:
            prompt.cancel()
            return result.error(f"{type(exc).__name__}: {exc}")
        finally:
            browser.cookies.clear()

    def settle(self, result: Result, flows: list[Flow]) -> None:
        """Lost and duplicated completions, and callback -> complete latencies, of flows that reached the callback."""
        for flow in flows:
            if flow.callback_sent is None:
                continue
            if not flow.completions:
                result.lost += 1
            elif len(flow.completions) > 1:
                result.duplicated += 1
            if flow.completions:
                result.latencies_ms.append((flow.completions[0] - flow.callback_sent) * 1000)
                if flow.callback_answered is not None:
                    result.after_response_ms.append((flow.completions[0] - flow.callback_answered) * 1000)


class Baseline:
    """The baseline app's flow: /login -> the provider's authorize -> /callback."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def flow(self, browser: httpx.AsyncClient, worker: int, result: Result) -> None:
        try:
            login = await browser.get(f"{self.base_url}/login")
            at_provider = await browser.get(login.headers["location"])
            done = await browser.get(at_provider.headers["location"])
            if done.status_code != 200:
                return result.error(f"callback {done.status_code}")
            result.flows += 1
        except Exception as exc:
            return result.error(f"{type(exc).__name__}: {exc}")
        finally:
            browser.cookies.clear()


FlowFn = Callable[[httpx.AsyncClient, int, Result], Awaitable[None]]


async def run_flows(flow: FlowFn, count: int, concurrency: int) -> Result:
    """`count` flows, `concurrency` at a time."""
    result = Result()
    remaining = count

    async def worker(index: int) -> None:
        nonlocal remaining
        async with httpx.AsyncClient(verify=TLS, timeout=60.0, follow_redirects=False) as browser:
            while remaining > 0:
                remaining -= 1
                await flow(browser, index, result)

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    result.seconds = time.perf_counter() - start
    return result


def provider_catalog(provider: str) -> str:
    """A providers.toml naming the mock provider at `provider` as `github`."""
    return (
        "[github]\n"
        'display_name = "Mock Provider"\n'
        f'authorization_endpoint = "{provider}/authorize"\n'
        f'token_endpoint = "{provider}/token"\n'
        f'userinfo_endpoint = "{provider}/api/user"\n'
        f'api_base_url = "{provider}/api"\n'
        'default_scopes = ["read:user"]\n'
        'account_id_field = "id"\n'
    )
