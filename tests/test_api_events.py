"""`GET /v1/events`: Server-Sent Events from the durable event log, resumable with Last-Event-ID, per tenant."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.store import Store
from service.testing import MockOAuthProvider, ScriptedBrowser

from .api_support import api_client, create_body, make_key
from .conftest import ALICE, Deploy, Deployment, fresh_postgres_database
from .js_receivers_support import node_command
from .sidecar_support import free_port, sidecar_env, sidecar_process


class EventReader:
    """One SSE connection: parses frames as they arrive into (id, data) pairs; the opening `ready` frame's id and
    the comments apart."""

    def __init__(self) -> None:
        self.events: list[tuple[int, dict[str, Any]]] = []
        self.ready_id: int | None = None
        self.comments: list[str] = []
        self.arrived = asyncio.Condition()

    async def read(self, response: httpx.Response) -> None:
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line == "":
                if fields.get("event") == "ready":
                    self.ready_id = int(fields["id"])
                elif "data" in fields:
                    async with self.arrived:
                        self.events.append((int(fields["id"]), json.loads(fields["data"])))
                        self.arrived.notify_all()
                fields = {}
            elif line.startswith(":"):
                async with self.arrived:
                    self.comments.append(line[1:].strip())
                    self.arrived.notify_all()
            else:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")

    async def wait_for(self, count: int) -> list[tuple[int, dict[str, Any]]]:
        async with asyncio.timeout(20):
            async with self.arrived:
                await self.arrived.wait_for(lambda: len(self.events) >= count)
        return self.events

    async def wait_for_comments(self, count: int, containing: str = "") -> list[str]:
        async with asyncio.timeout(20):
            async with self.arrived:
                await self.arrived.wait_for(lambda: sum(containing in c for c in self.comments) >= count)
        return self.comments


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


async def test_each_stream_keeps_itself_alive_whatever_other_tenants_hear(deploy_with: Deploy) -> None:
    """A stream that sends nothing sends a keep-alive comment after its own quiet time, while another tenant's
    stream gets an event every quarter of it; the busy one opens with its starting position (`ready`)."""
    async with deploy_with(CONNECTOR_API__EVENTS_KEEPALIVE_SECONDS="1") as deployment:
        store = deployment.connector.runtime.store
        quiet_key, busy_key = await make_key(store, "agent-a"), await make_key(store, "agent-b")
        async with (
            api_client(deployment.base_url, busy_key) as busy_api,
            stream(deployment.base_url, quiet_key) as quiet,
            stream(deployment.base_url, busy_key) as busy,
        ):
            for n in range(14):  # 3.5 s of events for the busy tenant only
                created = await busy_api.post("/v1/elicitations", json=create_body(ALICE, scopes=[f"s{n}"]))
                await busy_api.post(f"/v1/elicitations/{created.json()['elicitationId']}/cancel")
                await asyncio.sleep(0.25)
            assert await quiet.wait_for_comments(2) and set(quiet.comments) == {"keep-alive"}
            assert quiet.events == [] and len(busy.events) == 14
            assert quiet.ready_id is not None and busy.ready_id == quiet.ready_id


def sidecar_with(env: dict[str, str], port: int) -> dict[str, str]:
    return {**env, "CONNECTOR_SERVER__PORT": str(port), "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}"}


async def read_until(process: asyncio.subprocess.Process, seen: list[dict[str, Any]], events: int) -> None:
    """Read the node client's JSON lines into `seen` until it has reported `events` elicitation events."""
    assert process.stdout is not None
    async with asyncio.timeout(60):
        while sum("data" in line for line in seen) < events:
            line = await process.stdout.readline()
            assert line, "the EventSource client ended"
            seen.append(json.loads(line))


@pytest.mark.duration(30)
async def test_a_real_eventsource_client_misses_nothing_across_a_restart(tmp_path: Path) -> None:
    """The npm `eventsource` client (WHATWG reconnection) connects before any event. The sidecar stops (SIGTERM)
    with it and 9 more streams open: every stream gets a last comment and ends, and the process exits at once
    (nothing left for the grace period to cancel). While it is down another replica ends an elicitation; the
    client reconnects to the restarted sidecar with the opening id as Last-Event-ID and gets that event once, then
    a later one."""
    provider = MockOAuthProvider()
    command = node_command("sse_client.mjs")
    async with provider.serve_http():
        env = sidecar_env(
            tmp_path, {"github": provider.catalog_entry()}, {"github": (provider.client_id, provider.client_secret)}
        )
        env["CONNECTOR_SERVER__SHUTDOWN_GRACE_SECONDS"] = "60"
        base_url = env["CONNECTOR_PUBLIC_BASE_URL"]
        store_url = env["CONNECTOR_DATABASE__URL"]
        log_a = tmp_path / "a.log"
        seen: list[dict[str, Any]] = []
        async with sidecar_process(env, log_a) as pid:
            store = Store.from_url(store_url)
            try:
                key = await make_key(store)
            finally:
                await store.close()
            client = await asyncio.create_subprocess_exec(
                *command, f"{base_url}/v1/events", key, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
            try:
                assert client.stdout is not None
                seen += [json.loads(await client.stdout.readline()) for _ in range(2)]
                assert seen == [{"open": True}, {"ready": "0"}]
                async with AsyncExitStack() as streams:
                    readers = [await streams.enter_async_context(stream(base_url, key)) for _ in range(9)]
                    os.kill(pid, signal.SIGTERM)
                    for reader in readers:
                        await reader.wait_for_comments(1, containing="shutting down")
                    seen.append(json.loads(await client.stdout.readline()))  # it notices the end of its stream
                    assert "error" in seen[2]
                for _ in range(600):
                    if "Finished server process" in log_a.read_text():
                        break
                    await asyncio.sleep(0.05)
                log = log_a.read_text()
                assert "Finished server process" in log and "timeout graceful shutdown exceeded" not in log
                # Another replica on the same database ends an elicitation while this one is down.
                other = sidecar_with(env, free_port())
                async with (
                    sidecar_process(other, tmp_path / "b.log", migrate_first=False),
                    api_client(other["CONNECTOR_PUBLIC_BASE_URL"], key) as api_b,
                ):
                    missed = (await api_b.post("/v1/elicitations", json=create_body(ALICE))).json()["elicitationId"]
                    await api_b.post(f"/v1/elicitations/{missed}/cancel")
                async with (
                    sidecar_process(env, tmp_path / "a2.log", migrate_first=False),
                    api_client(base_url, key) as api,
                ):
                    await read_until(client, seen, 1)  # reconnected, and the missed event
                    later = (await api.post("/v1/elicitations", json=create_body(ALICE, scopes=["x"]))).json()
                    await api.post(f"/v1/elicitations/{later['elicitationId']}/cancel")
                    await read_until(client, seen, 2)
            finally:
                client.stdin.close()  # type: ignore[union-attr]
                await client.wait()
    events = [line["data"] for line in seen if "data" in line]
    assert [(e["elicitationId"], e["status"]) for e in events] == [
        (missed, "cancelled"),
        (later["elicitationId"], "cancelled"),
    ]
    # It reconnected once, resuming from the opening id (a stream without Last-Event-ID would start after `missed`).
    assert [line["ready"] for line in seen if "ready" in line] == ["0", "0"], seen
