"""`/metrics` on the wire: after a known sequence of flows, each metric holds the value that sequence implies; the
webhook backlog gauges follow deliveries waiting for retries, read once per poll interval and only where they can be.

Scraped over HTTP from a real loopback server; parsed with prometheus-client's own parser.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event, func, select

from service import AuthorizationStatus, ElicitationStatus, GrantNeedsUser
from service.store import Store, tables
from service.testing import ScriptedBrowser
from service.web.server import make_server

from .acp_peers import RecordingClient, connect, eventually, prompt_text, status_is
from .api_support import api_client, create_body, make_key
from .conftest import ALICE, BOB, Deploy, Deployment
from .test_api_webhooks import FAST, receiving
from .test_api_webhooks import eventually as webhooks_eventually

METRICS_TOKEN = "metrics-token-" + "x" * 24


async def scrape(url: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx.AsyncClient() as client:
        return await client.get(url, headers=headers)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in found, f"{name}{labels} is not exposed"
    return found[key]


async def run_prompt(deployment: Deployment, answer: str) -> tuple[str, AuthorizationStatus]:
    """One prompt of the test agent; the browser finishes it when the client accepts. (elicitation id, status)"""
    client = RecordingClient(answer=answer)
    wire = await connect(deployment.connector, deployment.local_user, client)
    prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("repos")))
    url = await asyncio.wait_for(client.urls.get(), 10)
    if answer == "accept":
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(url)).status_code == 200
    await asyncio.wait_for(prompt, 10)
    outcome = wire.agent.outcomes[0]
    await wire.close()
    assert outcome.elicitation_id is not None
    return outcome.elicitation_id, outcome.status


async def test_each_metric_holds_what_a_known_sequence_of_flows_implies(deployment: Deployment) -> None:
    connector, provider, user = deployment.connector, deployment.provider, deployment.local_user

    declined_id, declined = await run_prompt(deployment, "decline")
    completed_id, completed = await run_prompt(deployment, "accept")  # token + userinfo calls, one API call
    assert (completed, declined) == (AuthorizationStatus.AUTHORIZED, AuthorizationStatus.DECLINED)

    async with connector.http(user, "github") as github:
        provider.expire_access_tokens()
        assert (await github.get("user")).status_code == 200  # a 401, one refresh, the retry
        provider.expire_access_tokens()
        provider.revoke_refresh_tokens()
        with pytest.raises(GrantNeedsUser):  # a 401, a refused refresh: the grant needs the user, and says so
            await github.get("user")

    # One elicitation left open: the client accepted, the browser never came.
    accepting = RecordingClient(answer="accept")
    wire = await connect(connector, BOB, accepting)  # Bob holds no grant yet
    open_prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-2", prompt=prompt_text("repos")))
    open_id = (await asyncio.wait_for(accepting.urls.get(), 10)).rsplit("/", 1)[-1]
    await eventually(lambda: status_is(connector, open_id, ElicitationStatus.CONSENTED), "the client consented")

    # Rate limits: the bare /connect page is limited per address (60 a minute by default).
    async with httpx.AsyncClient() as client:
        statuses = [(await client.get(f"{deployment.base_url}/connect")).status_code for _ in range(80)]
    limited = statuses.count(429)
    assert limited > 0

    async with connector.runtime.store.engine.connect():  # one connection held out of the pool while scraping
        response = await scrape(f"{deployment.base_url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)

    assert value(found, "acp_connector_flows_started_total", provider="github") == 3
    assert value(found, "acp_connector_flows_ended_total", provider="github", outcome="completed") == 1
    assert value(found, "acp_connector_flows_ended_total", provider="github", outcome="declined") == 1
    assert value(found, "acp_connector_completions_total", result="sent") == 1
    assert value(found, "acp_connector_completion_delivery_seconds_count") == 1
    assert value(found, "acp_connector_completion_delivery_seconds_sum") > 0
    assert value(found, "acp_connector_pending_elicitations", status="consented") == 1
    assert value(found, "acp_connector_pending_elicitations", status="pending") == 0
    assert value(found, "acp_connector_token_refreshes_total", provider="github", result="refreshed") == 1
    assert value(found, "acp_connector_token_refreshes_total", provider="github", result="needs_user") == 1
    assert value(found, "acp_connector_token_refresh_failures_total", provider="github", reason="revoked") == 1
    for endpoint, calls, errors in (("token", 1, 0), ("userinfo", 1, 0), ("refresh", 2, 1)):
        labels = {"provider": "github", "endpoint": endpoint}
        assert value(found, "acp_connector_provider_request_seconds_count", **labels) == calls, endpoint
        assert found.get(("acp_connector_provider_errors_total", frozenset(labels.items())), 0) == errors
    assert value(found, "acp_connector_rate_limited_total", route="connect", key="address") == limited
    assert value(found, "acp_connector_db_pool_connections_in_use") >= 1
    assert value(found, "acp_connector_event_bus_reconnects_total") == 0

    # Bounded labels: no user, elicitation id, URL or secret appears anywhere in the exposition.
    unbounded = (user.subject, user.issuer, completed_id, declined_id, open_id, deployment.base_url)
    for text in (*unbounded, *provider.secrets_issued()):
        assert text not in response.text

    open_prompt.cancel()
    await wire.close()


async def test_metrics_need_the_bearer_token_when_one_is_set(deploy_with: Deploy) -> None:
    async with deploy_with(CONNECTOR_METRICS__BEARER_TOKEN=METRICS_TOKEN) as deployment:
        url = f"{deployment.base_url}/metrics"
        for refused in (await scrape(url), await scrape(url, "wrong-token-" + "y" * 20)):
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "metrics_unauthorized"
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert "acp_connector" not in refused.text
        allowed = await scrape(url, METRICS_TOKEN)
        assert allowed.status_code == 200 and "acp_connector_flows_started_total" in allowed.text


@pytest.fixture
def metrics_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def metrics_listener(deploy_with: Deploy, metrics_port: int) -> AsyncIterator[tuple[Deployment, str]]:
    async with deploy_with(CONNECTOR_METRICS__PORT=str(metrics_port)) as deployment:
        app = deployment.connector.metrics_asgi_app()
        assert app is not None
        server = make_server(app, "127.0.0.1", metrics_port)
        task = asyncio.create_task(server.serve())
        while not server.started:  # noqa: ASYNC110 - uvicorn offers a flag, not an event
            await asyncio.sleep(0.01)
        try:
            yield deployment, f"http://127.0.0.1:{metrics_port}"
        finally:
            server.stop()
            await task


async def test_metrics_on_their_own_listener_are_not_on_the_public_one(
    metrics_listener: tuple[Deployment, str],
) -> None:
    deployment, metrics_base = metrics_listener
    public = await scrape(f"{deployment.base_url}/metrics")
    assert public.status_code == 404
    own = await scrape(f"{metrics_base}/metrics")
    assert own.status_code == 200 and "acp_connector_pending_elicitations" in own.text
    assert (await scrape(f"{metrics_base}/connect")).status_code == 404  # nothing else is served there


@pytest.mark.parametrize(
    ("script", "settings", "expected"),
    [
        pytest.param(
            lambda n: "fail" if n == 1 else "ok", {}, {"delivered": 1, "retried": 1, "failed": 0}, id="retried"
        ),
        pytest.param(
            lambda n: "fail",
            {"CONNECTOR_WEBHOOKS__MAX_AGE_SECONDS": "0.001"},  # the first failure is too late for a retry
            {"delivered": 0, "retried": 0, "failed": 1},
            id="given-up",
        ),
    ],
)
async def test_webhook_attempts_are_counted_by_what_followed(
    deploy_with: Deploy, script: Callable[[int], str], settings: dict[str, str], expected: dict[str, int]
) -> None:
    attempts = sum(expected.values())
    async with deploy_with(**FAST, **settings) as deployment, receiving(script) as receiver:
        key = await make_key(deployment.connector.runtime.store, "agent-a")
        async with api_client(deployment.base_url, key) as api:
            webhook = (await api.post("/v1/webhooks", json={"url": receiver.url})).json()
            created = (await api.post("/v1/elicitations", json=create_body(ALICE, connectionId="c1"))).json()
            await api.post(f"/v1/elicitations/{created['elicitationId']}/answer", json={"action": "decline"})

            async def ended() -> dict[str, Any] | None:
                found = (await api.get(f"/v1/webhooks/{webhook['webhookId']}/deliveries")).json()["deliveries"]
                return found[0] if found and found[0]["status"] in ("delivered", "failed") else None

            delivery = await webhooks_eventually(ended)

            async def scraped() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
                response = await scrape(f"{deployment.base_url}/metrics")
                found = samples(response.text)
                # The counter moves just after the delivery's row: wait for this process to have counted it.
                counted = value(found, "acp_connector_webhook_attempt_seconds_count") == attempts
                return found if counted else None

            found = await webhooks_eventually(scraped)
            text = (await scrape(f"{deployment.base_url}/metrics")).text

    assert delivery["attempts"] == attempts and len(receiver.requests) == attempts
    for result, count in expected.items():
        assert value(found, "acp_connector_webhook_deliveries_total", result=result) == count, result
    assert value(found, "acp_connector_webhook_attempt_seconds_sum") > 0
    assert value(found, "acp_connector_webhook_attempt_seconds_bucket", le="+Inf") == attempts
    # Bounded labels: no tenant, endpoint, URL or event id.
    for unbounded in ("agent-a", webhook["webhookId"], receiver.url, created["elicitationId"]):
        assert unbounded not in text


def backlog(found: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> tuple[float, float]:
    return (
        value(found, "acp_connector_webhook_deliveries_waiting"),
        value(found, "acp_connector_webhook_oldest_waiting_seconds"),
    )


async def oldest_waiting_created_at(store: Store) -> datetime | None:
    d = tables.webhook_deliveries.c
    async with store.engine.connect() as conn:
        statement = select(func.min(d.created_at)).where(d.status.in_(("pending", "delivering")))
        return (await conn.execute(statement)).scalar()


@pytest.mark.duration(4)
async def test_webhook_backlog_gauges_show_deliveries_waiting_for_a_retry_then_none(
    deploy_with: Deploy, database_url: str
) -> None:
    """Two deliveries to a receiver answering 500 wait for retries: the gauges show 2 and the oldest one's age, read
    from the database; once the receiver recovers and both are delivered, 0 and 0."""
    answer = {"now": "fail"}
    async with (
        deploy_with(**FAST, CONNECTOR_DATABASE__URL=database_url) as deployment,
        receiving(lambda n: answer["now"]) as receiver,
    ):
        store = deployment.connector.runtime.store
        url = f"{deployment.base_url}/metrics"
        assert backlog(samples((await scrape(url)).text)) == (0, 0)
        key = await make_key(store, "agent-a")
        async with api_client(deployment.base_url, key) as api:
            webhook = (await api.post("/v1/webhooks", json={"url": receiver.url})).json()
            for n in range(2):
                made = (await api.post("/v1/elicitations", json=create_body(ALICE, scopes=[f"s{n}"]))).json()
                await api.post(f"/v1/elicitations/{made['elicitationId']}/cancel")
            await receiver.wait_until(lambda r: len(r.by_id()) == 2 and all(len(v) >= 2 for v in r.by_id().values()))

            async def waiting() -> tuple[float, float] | None:
                found = backlog(samples((await scrape(url)).text))
                return found if found[0] == 2 and found[1] > 0 else None

            _, age = await webhooks_eventually(waiting)
            oldest = await oldest_waiting_created_at(store)
            assert oldest is not None
            # The oldest delivery's age as the database has it, read at most a poll interval (and a margin) ago.
            assert 0 < age <= (datetime.now(UTC) - oldest).total_seconds() + 0.01
            assert age >= (datetime.now(UTC) - oldest).total_seconds() - 2
            later = await webhooks_eventually(
                lambda: _backlog_when(url, lambda found: found[1] > age + 0.1)  # it keeps growing while it waits
            )
            assert later[0] == 2

            answer["now"] = "ok"

            async def all_delivered() -> bool:
                found = (await api.get(f"/v1/webhooks/{webhook['webhookId']}/deliveries")).json()["deliveries"]
                return len(found) == 2 and {d["status"] for d in found} == {"delivered"}

            await webhooks_eventually(all_delivered)
            assert await webhooks_eventually(lambda: _backlog_when(url, lambda found: found == (0, 0))) == (0, 0)


async def _backlog_when(url: str, condition: Callable[[tuple[float, float]], bool]) -> tuple[float, float] | None:
    found = backlog(samples((await scrape(url)).text))
    return found if condition(found) else None


def backlog_reads(store: Store) -> list[str]:
    """A list that collects, from now on, every statement of `store` that reads the webhook backlog."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "min(webhook_deliveries.created_at)" in statement:
            seen.append(statement)

    for engine in {store.db.writer, store.db.reader}:
        event.listen(engine.sync_engine, "before_cursor_execute", record)
    return seen


@pytest.mark.duration(3)
async def test_webhook_backlog_is_read_once_per_interval_not_per_event_or_scrape(deploy_with: Deploy) -> None:
    interval = 0.5
    settings = {**FAST, "CONNECTOR_WEBHOOKS__POLL_INTERVAL_SECONDS": str(interval)}
    async with deploy_with(**settings) as deployment, receiving() as receiver:
        store = deployment.connector.runtime.store
        url = f"{deployment.base_url}/metrics"
        key = await make_key(store, "agent-a")
        async with api_client(deployment.base_url, key) as api:
            assert (await api.post("/v1/webhooks", json={"url": receiver.url})).status_code == 201
            await asyncio.sleep(interval * 2)  # the worker has seen the endpoint
            reads = backlog_reads(store)
            started = time.monotonic()
            for n in range(10):  # ten events, each waking the worker, and ten scrapes
                made = (await api.post("/v1/elicitations", json=create_body(ALICE, scopes=[f"s{n}"]))).json()
                await api.post(f"/v1/elicitations/{made['elicitationId']}/cancel")
                assert (await scrape(url)).status_code == 200
            await receiver.wait_until(lambda r: len(r.by_id()) == 10)
            await asyncio.sleep(interval * 3)  # the worker's own rounds: a read in each
            elapsed = time.monotonic() - started
            assert backlog(samples((await scrape(url)).text)) == (0, 0)
    assert 1 <= len(reads) <= elapsed / interval + 2, (len(reads), elapsed)


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({}, id="no-endpoint"),
        pytest.param({"CONNECTOR_WEBHOOKS__DELIVER": "false"}, id="delivery-off"),
        pytest.param({"CONNECTOR_METRICS__ENABLED": "false"}, id="metrics-off"),
    ],
)
async def test_webhook_backlog_is_not_read_without_an_endpoint_or_delivery_or_metrics(
    deploy_with: Deploy, settings: dict[str, str]
) -> None:
    async with deploy_with(**FAST, **settings) as deployment:
        store = deployment.connector.runtime.store
        reads = backlog_reads(store)
        key = await make_key(store, "agent-a")
        async with api_client(deployment.base_url, key) as api:
            if settings:  # delivery or metrics are off here: an endpoint and its events change nothing
                assert (await api.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"})).status_code == 201
            for n in range(3):
                made = (await api.post("/v1/elicitations", json=create_body(ALICE, scopes=[f"s{n}"]))).json()
                await api.post(f"/v1/elicitations/{made['elicitationId']}/cancel")
        await asyncio.sleep(0.5)  # ten poll intervals
        scraped = await scrape(f"{deployment.base_url}/metrics")
    assert reads == []
    if "CONNECTOR_METRICS__ENABLED" in settings:
        assert scraped.status_code == 404
    else:
        assert backlog(samples(scraped.text)) == (0, 0)
