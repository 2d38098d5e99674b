"""`GET /v1/events`: Server-Sent Events from the durable event log, resumable with Last-Event-ID, per tenant."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.store import Store
from service.testing import MockOAuthProvider, ScriptedBrowser

from .api_support import api_client, create_body, make_key
from .conftest import ALICE, Deployment, fresh_postgres_database
from .sidecar_support import free_port, sidecar_env, sidecar_process


class EventReader:
    """One SSE connection: parses frames as they arrive into (id, data) pairs."""

    def __init__(self) -> None:
        self.events: list[tuple[int, dict[str, Any]]] = []
        self.arrived = asyncio.Condition()

    async def read(self, response: httpx.Response) -> None:
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line == "":
                if "data" in fields:
                    async with self.arrived:
                        self.events.append((int(fields["id"]), json.loads(fields["data"])))
                        self.arrived.notify_all()
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")

    async def wait_for(self, count: int) -> list[tuple[int, dict[str, Any]]]:
        async with asyncio.timeout(20):
            async with self.arrived:
                await self.arrived.wait_for(lambda: len(self.events) >= count)
        return self.events


@asynccontextmanager
async def stream(base_url: str, key: str, last_event_id: int | None = None) -> AsyncIterator[EventReader]:
    headers = {"Authorization": f"Bearer {key}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    reader = EventReader()
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(30, read=None)) as client:
        async with client.stream("GET", "/v1/events", headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            task = asyncio.create_task(reader.read(response))
            try:
                yield reader
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_events_are_resumed_exactly_once_and_stay_with_their_tenant(deployment: Deployment) -> None:
    store = deployment.connector.runtime.store
    key, other = await make_key(store, "agent-a"), await make_key(store, "agent-b")
    user = deployment.local_user
    async with api_client(deployment.base_url, key) as api, api_client(deployment.base_url, other) as api_b:

        async def new(client: httpx.AsyncClient, **extra: object) -> str:
            return str((await client.post("/v1/elicitations", json=create_body(user, **extra))).json()["elicitationId"])

        async with stream(deployment.base_url, key) as first:
            declined = await new(api, connectionId="c1")
            await api.post(f"/v1/elicitations/{declined}/answer", json={"action": "decline"})
            await api_b.post(f"/v1/elicitations/{await new(api_b)}/cancel")  # another tenant's: never seen
            ((first_id, first_event),) = await first.wait_for(1)
        assert first_event == {
            "id": first_id,
            "elicitationId": declined,
            "status": "declined",
            "outcome": "declined",
            "connectionId": "c1",
        }
        # While no one listens: one cancelled, one completed through the browser.
        cancelled = await new(api, scopes=["a"])
        await api.post(f"/v1/elicitations/{cancelled}/cancel")
        completed = (await api.post("/v1/elicitations", json=create_body(user, scopes=["b"]))).json()
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(completed["url"])).status_code == 200

        async with stream(deployment.base_url, key, last_event_id=first_id) as resumed:
            events = await resumed.wait_for(2)
            await asyncio.sleep(0.2)  # anything else that would (wrongly) arrive, arrives now
        assert [(e["elicitationId"], e["status"], e["outcome"]) for _, e in resumed.events] == [
            (cancelled, "cancelled", "cancelled"),
            (completed["elicitationId"], "completed", "authorized"),
        ]
        ids = [event_id for event_id, _ in events]
        assert ids == sorted(ids) and ids[0] > first_id

        async with stream(deployment.base_url, key, last_event_id=ids[-1]) as caught_up:
            later = await new(api, scopes=["c"])
            await api.post(f"/v1/elicitations/{later}/cancel")
            ((_, event),) = await caught_up.wait_for(1)
        assert event["elicitationId"] == later


async def test_events_refuse_bad_input(deployment: Deployment) -> None:
    key = await make_key(deployment.connector.runtime.store)
    async with api_client(deployment.base_url, None) as anonymous:
        assert (await anonymous.get("/v1/events")).status_code == 401
    async with api_client(deployment.base_url, key) as api:
        for headers in ({"Last-Event-ID": "abc"}, {"Last-Event-ID": "-1"}, {"Last-Event-ID": "1" * 40}):
            response = await api.get("/v1/events", headers=headers)
            assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_input"


@pytest.mark.duration(6)
async def test_events_cross_replicas_on_postgresql(tmp_path: Path) -> None:
    """Two sidecar processes on one PostgreSQL database: a stream held on replica A hears a change made on B, and
    a client that moves to B with Last-Event-ID gets every later event exactly once."""
    provider = MockOAuthProvider()
    async with fresh_postgres_database() as database_url, provider.serve_http():
        env_a = sidecar_env(
            tmp_path, {"github": provider.catalog_entry()}, {"github": (provider.client_id, provider.client_secret)}
        )
        env_a["CONNECTOR_DATABASE__URL"] = database_url
        port_b = free_port()
        env_b = {
            **env_a,
            "CONNECTOR_SERVER__PORT": str(port_b),
            "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port_b}",
        }
        async with (
            sidecar_process(env_a, tmp_path / "a.log"),
            sidecar_process(env_b, tmp_path / "b.log", migrate_first=False),
        ):
            store = Store.from_url(database_url)
            try:
                key = await make_key(store)
            finally:
                await store.close()
            a, b = env_a["CONNECTOR_PUBLIC_BASE_URL"], env_b["CONNECTOR_PUBLIC_BASE_URL"]
            async with api_client(a, key) as api_a, api_client(b, key) as api_b:
                async with stream(a, key) as on_a:
                    created = (await api_b.post("/v1/elicitations", json=create_body(ALICE))).json()
                    await api_b.post(f"/v1/elicitations/{created['elicitationId']}/answer", json={"action": "accept"})
                    async with ScriptedBrowser() as browser:  # the whole browser flow against replica B
                        assert (await browser.authorize(created["url"])).status_code == 200
                    ((seen_id, seen),) = await on_a.wait_for(1)
                assert (seen["elicitationId"], seen["outcome"]) == (created["elicitationId"], "authorized")
                # While the client moves from A to B, A cancels one: B's stream resumes right after seen_id.
                other = (await api_a.post("/v1/elicitations", json=create_body(ALICE, scopes=["x"]))).json()
                await api_a.post(f"/v1/elicitations/{other['elicitationId']}/cancel")
                async with stream(b, key, last_event_id=seen_id) as on_b:
                    events = await on_b.wait_for(1)
                    await asyncio.sleep(0.5)
                assert [(e["elicitationId"], e["status"]) for _, e in on_b.events] == [
                    (other["elicitationId"], "cancelled")
                ]
                assert events[0][0] > seen_id
