"""Driving one flow over real ACP: start an elicitation over real ACP, walk a browser to the callback, inspect."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx
import pytest

from service import AuthorizationOutcome, ElicitationStatus, Identity, SessionScope
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, Wire, connect
from .conftest import Deployment


@dataclass
class Pending:
    """An elicitation the agent is waiting on, with its connect URL."""

    wire: Wire
    client: RecordingClient
    task: asyncio.Task[AuthorizationOutcome]
    url: str
    elicitation_id: str

    async def outcome(self) -> AuthorizationOutcome:
        return await asyncio.wait_for(self.task, 10)


Ask = Callable[..., Awaitable[Pending]]


@contextlib.asynccontextmanager
async def asking(deployment: Deployment) -> AsyncIterator[Ask]:
    """`ask(provider=..., scopes=...)` starts one elicitation; everything is closed when the block ends."""
    started: list[Pending] = []

    async def ask(
        provider: str = "github",
        scopes: Sequence[str] = ("repo",),
        user: Identity | None = None,
        answer: str = "accept",
        message: str | None = None,
    ) -> Pending:
        client = RecordingClient(answer=answer)
        wire = await connect(deployment.connector, deployment.local_user, client)
        assert wire.agent.conn is not None
        task = asyncio.create_task(
            deployment.connector.request_authorization(
                wire.agent.conn,
                wire.agent.capabilities,
                user=user or deployment.local_user,
                provider=provider,
                scopes=list(scopes),
                scope=SessionScope("sess-1", tool_call_id=f"call-{len(started)}"),
                message=message,
            )
        )
        url = await asyncio.wait_for(client.urls.get(), 10)
        pending = Pending(wire, client, task, url, urlsplit(url).path.rsplit("/", 1)[1])
        started.append(pending)
        return pending

    try:
        yield ask
    finally:
        for pending in started:
            pending.task.cancel()
            with contextlib.suppress(BaseException):
                await pending.task
            with contextlib.suppress(Exception):
                await pending.wire.close()


async def to_provider(browser: ScriptedBrowser, connect_url: str) -> httpx.Response:
    """Open the link and press Continue: the 303 to the provider's authorization endpoint."""
    page = await browser.get(connect_url)
    assert page.status_code == 200, page.text
    sent = await browser.submit(page, "continue")
    assert sent.status_code == 303, sent.text
    return sent


async def to_callback(browser: ScriptedBrowser, connect_url: str) -> str:
    """Walk to the provider and back up to (not into) our callback: the callback URL the provider redirects to."""
    sent = await to_provider(browser, connect_url)
    at_provider = await browser.get(sent.headers["location"])
    assert at_provider.status_code == 302, at_provider.text
    return urljoin(str(at_provider.url), at_provider.headers["location"])


async def answer_to(browser: ScriptedBrowser, callback_url: str) -> httpx.Response:
    """The provider's redirect to our callback, as the browser ends up seeing it. A refusal answers with a 303 to
    its clean page (`/callback/<provider>/failed/<ticket>`, no code or state in the address), followed here: the
    page with the refusal's status and `X-Connector-Error` is returned. A success's 303 (to the done page) is not
    followed."""
    answer = await browser.get(callback_url)
    location = answer.headers.get("location", "")
    if answer.status_code == 303 and "/failed/" in location:
        assert re.fullmatch(re.escape(urlsplit(callback_url).path) + r"/failed/[\w-]{16}", location), location
        answer = await browser.follow(answer)
        assert not answer.url.query, answer.url
    return answer


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def with_query(address: str, **changes: str | None) -> str:
    """`address` with query parameters replaced (None removes one)."""
    query = query_of(address)
    for key, value in changes.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    parts = urlsplit(address)
    return parts._replace(query=urlencode(query)).geturl()


async def events(deployment: Deployment, elicitation_id: str | None = None) -> list[str]:
    return [e.event for e in await deployment.connector.runtime.store.audit.list(elicitation_id=elicitation_id)]


async def status_of(deployment: Deployment, elicitation_id: str) -> ElicitationStatus:
    record = await deployment.connector.elicitation(elicitation_id)
    assert record is not None
    return record.status


async def assert_nothing_stored(deployment: Deployment, pending: Pending) -> None:
    """No grant for anyone, no completion sent, the elicitation not completed."""
    store = deployment.connector.runtime.store
    assert await store.grants.find(deployment.local_user, "github") == []
    for provider in deployment.connector.runtime.providers.catalog.entries():
        assert await store.grants.find(deployment.local_user, provider.name) == []
    assert await status_of(deployment, pending.elicitation_id) is not ElicitationStatus.COMPLETED
    assert pending.client.completions == []
    assert pending.wire.received("elicitation/complete") == []


def audit_log_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    """The structured `service.audit` log lines captured, as their extra fields."""
    return [
        {
            "event": getattr(r, "audit_event", None),
            "elicitation_id": getattr(r, "elicitation_id", None),
            "provider": getattr(r, "provider", None),
            "detail": getattr(r, "detail", None),
        }
        for r in caplog.records
        if r.name == "service.audit"
    ]
