"""Signed webhooks of the `/v1` API: registered per API key, delivered from the event log to a real receiver on
loopback, signed (checked by `verify_webhook` and recomputed here), retried after 5xx and timeouts, refused to
private addresses, delivered once per attempt by two replicas on PostgreSQL; bad registrations write nothing."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from sqlalchemy import func, select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service import verify_webhook
from service.cli.program import main
from service.client import WebhookVerificationError
from service.client import verify_webhook as client_verify_webhook
from service.core.webhooks import NO_ENDPOINT_RECHECK, WebhookEndpoints, WebhookPolicy
from service.events import HttpWebhookSender
from service.store import Store, migrate, tables
from service.testing import MockOAuthProvider
from service.vault import KeyRing, Vault

from .api_support import api_client, create_body, make_key
from .conftest import ALICE, Deploy, Deployment, fresh_postgres_database
from .sidecar_support import free_port, serve_app, sidecar_env, sidecar_process

FAST = {
    "CONNECTOR_WEBHOOKS__ALLOW_PRIVATE_ADDRESSES": "true",
    "CONNECTOR_WEBHOOKS__RETRY_INITIAL_SECONDS": "0.05",
    "CONNECTOR_WEBHOOKS__RETRY_MAX_SECONDS": "0.2",
    "CONNECTOR_WEBHOOKS__POLL_INTERVAL_SECONDS": "0.05",
    "CONNECTOR_WEBHOOKS__TIMEOUT_SECONDS": "1",
}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A webhook receiver on real uvicorn: records every request; `script(n)` chooses the n-th answer per id
    ("ok", "fail" = 500, "hang" = never answers, "redirect" = 307 elsewhere, "cookie" = ok with a Set-Cookie)."""

    script: Callable[[int], str] = lambda n: "ok"
    requests: list[Received] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    released: asyncio.Event = field(default_factory=asyncio.Event)  # ends every "hang" (set when the test ends)
    url: str = ""

    def by_id(self) -> dict[str, list[Received]]:
        grouped: dict[str, list[Received]] = {}
        for each in self.requests:
            grouped.setdefault(each.headers["webhook-id"], []).append(each)
        return grouped

    async def wait_until(self, done: Callable[[Receiver], bool]) -> None:
        async with asyncio.timeout(30):
            async with self.arrived:
                await self.arrived.wait_for(lambda: done(self))

    def app(self) -> Starlette:
        async def hook(request: Request) -> Response:
            received = Received({k.lower(): v for k, v in request.headers.items()}, await request.body())
            async with self.arrived:
                self.requests.append(received)
                self.arrived.notify_all()
            nth = len(self.by_id()[received.headers.get("webhook-id", "")])
            action = self.script(nth)
            if action == "hang":
                await self.released.wait()
            if action == "fail":
                return Response("no", 500)
            if action == "redirect":
                return Response(status_code=307, headers={"location": "/elsewhere"})
            if action == "cookie":
                return Response("ok", 200, headers={"set-cookie": "tenant_a_session=1; Path=/"})
            return Response("secret-looking answer body that is never stored", 200)

        async def elsewhere(request: Request) -> Response:
            raise AssertionError("a redirect was followed")

        return Starlette(routes=[Route("/hook", hook, methods=["POST"]), Route("/elsewhere", elsewhere)])


@asynccontextmanager
async def receiving(script: Callable[[int], str] = lambda n: "ok") -> AsyncIterator[Receiver]:
    receiver = Receiver(script)
    async with serve_app(receiver.app()) as base:
        receiver.url = f"{base}/hook"
        try:
            yield receiver
        finally:
            receiver.released.set()


async def eventually(check: Callable[[], Any]) -> Any:
    """Ask `check` (a coroutine function) until it answers something true; its answer."""
    async with asyncio.timeout(30):
        while not (found := await check()):  # noqa: ASYNC110 - a database row, not an event of this process
            await asyncio.sleep(0.02)
    return found


def recompute(secret: str, received: Received) -> str:
    """The signature as the Standard Webhooks specification (and the README) describe it, computed here without the
    connector's code: `v1,` and the base64 HMAC-SHA256, keyed by the secret's base64 bytes, of id.timestamp.body."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{received.headers['webhook-id']}.{received.headers['webhook-timestamp']}.".encode() + received.body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


async def count_rows(store: Store, table: Any) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_signed_delivery_with_retries_after_500_and_timeout(
    deploy_with: Deploy, captured_logs: pytest.LogCaptureFixture
) -> None:
    # Per event: 500, then no answer at all (the attempt times out), then 200.
    script = {1: "fail", 2: "hang"}
    async with deploy_with(**FAST) as deployment, receiving(lambda n: script.get(n, "ok")) as receiver:
        store = deployment.connector.runtime.store
        key, other = await make_key(store, "agent-a"), await make_key(store, "agent-b")
        async with api_client(deployment.base_url, key) as api, api_client(deployment.base_url, other) as api_b:
            made = await api.post("/v1/webhooks", json={"url": receiver.url, "description": "bot"})
            assert made.status_code == 201, made.text
            secret = made.json()["secret"]
            webhook_id = made.json()["webhookId"]
            assert secret.startswith("whsec_")
            listed = (await api.get("/v1/webhooks")).json()
            assert listed == {"webhooks": [{k: v for k, v in made.json().items() if k != "secret"}]}
            assert (await api_b.get("/v1/webhooks")).json() == {"webhooks": []}  # another tenant's

            created = (await api.post("/v1/elicitations", json=create_body(ALICE, connectionId="c1"))).json()
            await api.post(f"/v1/elicitations/{created['elicitationId']}/answer", json={"action": "decline"})
            theirs = (await api_b.post("/v1/elicitations", json=create_body(ALICE))).json()
            await api_b.post(f"/v1/elicitations/{theirs['elicitationId']}/cancel")  # never sent to agent-a

            await receiver.wait_until(lambda r: len(r.requests) >= 3)

            async def delivered() -> list[dict[str, Any]] | None:
                found = (await api.get(f"/v1/webhooks/{webhook_id}/deliveries")).json()["deliveries"]
                return found if found and found[0]["status"] == "delivered" else None

            deliveries = await eventually(delivered)

        (attempts,) = receiver.by_id().values()
        assert len(attempts) == 3 and len(receiver.requests) == 3
        envelope = json.loads(attempts[0].body)
        assert set(envelope) == {"type", "timestamp", "data"}  # the specification's envelope
        assert envelope["type"] == "elicitation.declined"
        logged = datetime.fromisoformat(envelope["timestamp"])  # when the event was logged, not when sent
        assert envelope["timestamp"].endswith("Z") and abs(datetime.now(UTC) - logged) < timedelta(minutes=5)
        event = envelope["data"]
        assert event == {
            "id": event["id"],
            "elicitationId": created["elicitationId"],
            "status": "declined",
            "outcome": "declined",
            "connectionId": "c1",
        }
        for each in attempts:
            assert each.headers["webhook-id"] == str(event["id"])  # the same id every time: receivers deduplicate
            assert each.body == attempts[0].body
            assert each.headers["webhook-signature"] == recompute(secret, each)
            assert client_verify_webhook(secret, each.headers, each.body) == envelope
            assert each.headers["content-type"] == "application/json"
        stamps = [int(each.headers["webhook-timestamp"]) for each in attempts]
        assert stamps == sorted(stamps)
        assert stamps[0] >= int(logged.timestamp())

        (delivery,) = deliveries
        assert (delivery["status"], delivery["attempts"], delivery["lastStatusCode"]) == ("delivered", 3, 200)
        assert delivery["eventId"] == event["id"] and delivery["deliveredAt"] is not None
        records = await store.webhooks.attempts(delivery["deliveryId"])
        assert [(r.attempt, r.status_code, r.error) for r in records] == [
            (1, 500, None),
            (2, None, "timeout"),
            (3, 200, None),
        ]
        # The secret is stored only encrypted, never logged; the answer's body is not kept.
        async with store.engine.connect() as conn:
            dump = repr((await conn.execute(select(tables.webhook_endpoints))).all())
            dump += repr((await conn.execute(select(tables.webhook_deliveries))).all())
            dump += repr((await conn.execute(select(tables.webhook_attempts))).all())
        assert secret not in dump and secret.removeprefix("whsec_") not in dump
        assert "never stored" not in dump
        assert secret.removeprefix("whsec_") not in captured_logs.text
        audit = await store.audit.list(event="webhook_created")
        assert [a.detail["webhook_id"] for a in audit] == [webhook_id]


async def test_verify_webhook_refuses_replays_tampering_and_wrong_secrets(deploy_with: Deploy) -> None:
    async with deploy_with(**FAST) as deployment, receiving() as receiver:
        key = await make_key(deployment.connector.runtime.store)
        async with api_client(deployment.base_url, key) as api:
            secret = (await api.post("/v1/webhooks", json={"url": receiver.url})).json()["secret"]
            created = (await api.post("/v1/elicitations", json=create_body(ALICE))).json()
            await api.post(f"/v1/elicitations/{created['elicitationId']}/cancel")
            await receiver.wait_until(lambda r: len(r.requests) >= 1)
    (received,) = receiver.requests
    headers, body = received.headers, received.body
    stamp = int(headers["webhook-timestamp"])
    assert verify_webhook(secret, headers, body, now=stamp + 299)["data"]["elicitationId"] == created["elicitationId"]
    other_secret = "whsec_" + base64.b64encode(b"\x01" * 32).decode()
    assert verify_webhook([other_secret, secret], headers, body, now=stamp)  # during a secret change
    refused: list[tuple[str | list[str], dict[str, str], bytes, float]] = [
        (secret, headers, body, stamp + 301),  # a replay, five minutes later
        (secret, headers, body, stamp - 301),
        (secret, headers, body.replace(b"cancelled", b"completed"), stamp),  # tampered
        (secret, {**headers, "webhook-id": "999999"}, body, stamp),  # another id
        (secret, {**headers, "webhook-timestamp": str(stamp + 1)}, body, stamp),  # another time
        (other_secret, headers, body, stamp),  # the wrong secret
        (secret, {k: v for k, v in headers.items() if k != "webhook-signature"}, body, stamp),
        (secret, {**headers, "webhook-signature": "v1," + base64.b64encode(b"0" * 32).decode()}, body, stamp),
        # The signature of the earlier, non-standard form (v1=<hex>) is no longer accepted.
        (secret, {**headers, "webhook-signature": "v1=" + headers["webhook-signature"][3:]}, body, stamp),
        (secret, {**headers, "webhook-timestamp": "soon"}, body, stamp),
    ]
    for each_secret, each_headers, each_body, now in refused:
        with pytest.raises(WebhookVerificationError):
            verify_webhook(each_secret, each_headers, each_body, now=now)


async def test_sender_refuses_private_addresses_after_resolution_and_follows_no_redirect() -> None:
    async with receiving(lambda n: "redirect") as receiver:
        port = int(receiver.url.split(":")[2].split("/")[0])

        async def rebinding(host: str, port: int) -> list[str]:
            return ["127.0.0.1"]  # a public-looking name that resolves to this host

        strict = HttpWebhookSender(timeout=2, allow_private=False, resolver=rebinding)
        try:
            expected = {
                f"https://hooks.example.com:{port}/hook": "address_refused",
                "https://[::ffff:10.0.0.1]/hook": "url_refused",
                receiver.url: "url_refused",  # http, and loopback
            }
            for url, error in expected.items():
                result = await strict.send(url, {"Webhook-Id": "1"}, b"{}")
                assert (result.delivered, result.status_code, result.error) == (False, None, error)
        finally:
            await strict.aclose()
        assert receiver.requests == []  # nothing left the sender

        lenient = HttpWebhookSender(timeout=2, allow_private=True)
        try:
            result = await lenient.send(receiver.url, {"Webhook-Id": "1"}, b"{}")
        finally:
            await lenient.aclose()
        assert (result.status_code, result.error, result.delivered) == (307, "redirect_not_followed", False)
        assert len(receiver.requests) == 1  # and /elsewhere was never asked for


async def test_sender_keeps_no_cookie_from_one_endpoint_for_the_next_delivery() -> None:
    """One sender serves every tenant's endpoints: a cookie one endpoint sets must not ride on later deliveries
    (another tenant's endpoint may live on the same host)."""
    async with receiving(lambda n: "cookie") as receiver:
        sender = HttpWebhookSender(timeout=2, allow_private=True)
        try:
            for webhook_id in ("1", "2"):
                assert (await sender.send(receiver.url, {"Webhook-Id": webhook_id}, b"{}")).delivered
        finally:
            await sender.aclose()
    assert [each.headers.get("cookie") for each in receiver.requests] == [None, None]


BAD_REGISTRATIONS: list[tuple[dict[str, Any] | bytes, str]] = [
    (b"{not json", "bad_request"),
    ({"url": "https://hooks.example.com/x", "surprise": 1}, "invalid_input"),
    ({}, "invalid_input"),
    ({"url": 42}, "invalid_input"),
    ({"url": "https://hooks.example.com/" + "x" * 3000}, "invalid_input"),
    ({"url": "https://hooks.example.com/x", "description": "a\x00b"}, "invalid_input"),
    ({"url": "http://hooks.example.com/x"}, "webhook_url_refused"),
    ({"url": "ftp://hooks.example.com/x"}, "webhook_url_refused"),
    ({"url": "https://user:pw@hooks.example.com/x"}, "webhook_url_refused"),
    ({"url": "https://hooks.example.com/x#frag"}, "webhook_url_refused"),
    ({"url": "http://127.0.0.1:9/x"}, "webhook_url_refused"),
    ({"url": "https://localhost/x"}, "webhook_url_refused"),
    ({"url": "https://hooks.localhost/x"}, "webhook_url_refused"),  # *.localhost is loopback (RFC 6761)
    ({"url": "https://169.254.169.254/latest/meta-data"}, "webhook_url_refused"),
    ({"url": "https://10.1.2.3/x"}, "webhook_url_refused"),
    ({"url": "https://[::1]/x"}, "webhook_url_refused"),
    ({"url": "https://[::ffff:192.168.0.1]/x"}, "webhook_url_refused"),
    ({"url": "https://hooks.example.com:99999/x"}, "webhook_url_refused"),
    ({"url": "https://hooks.exa mple.com/x"}, "webhook_url_refused"),
    ({"url": "not a url"}, "webhook_url_refused"),
]


async def test_bad_registrations_are_refused_with_stable_codes_and_write_nothing(deployment: Deployment) -> None:
    store = deployment.connector.runtime.store
    key, other = await make_key(store, "agent-a"), await make_key(store, "agent-b")
    async with api_client(deployment.base_url, None) as anonymous:
        for method, path in (("GET", "/v1/webhooks"), ("POST", "/v1/webhooks"), ("DELETE", "/v1/webhooks/wh_x")):
            answer = await anonymous.request(method, path, json={"url": "https://hooks.example.com/x"})
            assert (answer.status_code, answer.json()["error"]["code"]) == (401, "unauthorized")
    async with api_client(deployment.base_url, key) as api, api_client(deployment.base_url, other) as api_b:
        for body, code in BAD_REGISTRATIONS:
            sent = {"content": body} if isinstance(body, bytes) else {"json": body}
            answer = await api.post("/v1/webhooks", **sent)  # type: ignore[arg-type]
            assert 400 <= answer.status_code < 500, (body, answer.text)
            assert answer.json()["error"]["code"] == code, (body, answer.text)
            assert answer.json()["error"]["message"]
        assert await count_rows(store, tables.webhook_endpoints) == 0
        assert await store.audit.list(event="webhook_created") == []

        mine = (await api.post("/v1/webhooks", json={"url": "https://hooks.example.com/a"})).json()
        for path in (f"/v1/webhooks/{mine['webhookId']}", f"/v1/webhooks/{mine['webhookId']}/deliveries"):
            method = "DELETE" if path.endswith(mine["webhookId"]) else "GET"
            answer = await api_b.request(method, path)  # another tenant's endpoint is unknown to it
            assert (answer.status_code, answer.json()["error"]["code"]) == (404, "unknown_webhook")
        for limit in ("0", "101", "x"):
            answer = await api.get(f"/v1/webhooks/{mine['webhookId']}/deliveries", params={"limit": limit})
            assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_input")
        for n in range(9):
            assert (await api.post("/v1/webhooks", json={"url": f"https://hooks.example.com/{n}"})).status_code == 201
        over = await api.post("/v1/webhooks", json={"url": "https://hooks.example.com/11"})
        assert (over.status_code, over.json()["error"]["code"]) == (409, "webhook_limit")
        assert await count_rows(store, tables.webhook_endpoints) == 10
        assert (await api.delete(f"/v1/webhooks/{mine['webhookId']}")).status_code == 204
        again = await api.delete(f"/v1/webhooks/{mine['webhookId']}")
        assert (again.status_code, again.json()["error"]["code"]) == (404, "unknown_webhook")
        assert await count_rows(store, tables.webhook_endpoints) == 9


@pytest.mark.duration(12)
async def test_two_replicas_on_postgresql_make_each_attempt_once(tmp_path: Path) -> None:
    """Two sidecar processes deliver from one PostgreSQL database: each event reaches the receiver exactly twice
    (its first attempt answered 500, its second 200), and every attempt is recorded once."""
    provider = MockOAuthProvider()
    async with (
        fresh_postgres_database() as database_url,
        provider.serve_http(),
        receiving(lambda n: "fail" if n == 1 else "ok") as receiver,
    ):
        env_a = sidecar_env(
            tmp_path, {"github": provider.catalog_entry()}, {"github": (provider.client_id, provider.client_secret)}
        )
        env_a.update(FAST, CONNECTOR_DATABASE__URL=database_url)
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
                a, b = env_a["CONNECTOR_PUBLIC_BASE_URL"], env_b["CONNECTOR_PUBLIC_BASE_URL"]
                async with api_client(a, key) as api_a, api_client(b, key) as api_b:
                    assert (await api_a.post("/v1/webhooks", json={"url": receiver.url})).status_code == 201
                    ended = []
                    for n in range(8):
                        api = api_a if n % 2 else api_b
                        made = (await api.post("/v1/elicitations", json=create_body(ALICE, scopes=[f"s{n}"]))).json()
                        await api.post(f"/v1/elicitations/{made['elicitationId']}/cancel")
                        ended.append(made["elicitationId"])
                    await receiver.wait_until(
                        lambda r: len(r.by_id()) == 8 and all(len(v) >= 2 for v in r.by_id().values())
                    )

                    async def all_delivered() -> bool:
                        async with store.engine.connect() as conn:
                            found = (await conn.execute(select(tables.webhook_deliveries.c.status))).scalars().all()
                        return len(found) == 8 and set(found) == {"delivered"}

                    await eventually(all_delivered)
                    async with store.engine.connect() as conn:
                        attempts = (
                            await conn.execute(
                                select(tables.webhook_attempts.c.delivery_id, tables.webhook_attempts.c.attempt)
                            )
                        ).all()
                        deliveries = (await conn.execute(select(tables.webhook_deliveries))).mappings().all()
            finally:
                await store.close()
    assert sorted({json.loads(r.body)["data"]["elicitationId"] for r in receiver.requests}) == sorted(ended)
    assert {event_id: len(sent) for event_id, sent in receiver.by_id().items()} == {
        str(d["event_id"]): 2 for d in deliveries
    }
    assert sorted(d["status"] for d in deliveries) == ["delivered"] * 8
    assert sorted(attempt for _, attempt in attempts) == [1] * 8 + [2] * 8
    assert len(set(attempts)) == 16
    assert "Traceback" not in (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()


def verifies(secret: str, received: Received) -> bool:
    try:
        client_verify_webhook(secret, received.headers, received.body)
    except WebhookVerificationError:
        return False
    return True


async def end_one_elicitation(api: Any) -> str:
    created = (await api.post("/v1/elicitations", json=create_body(ALICE))).json()
    await api.post(f"/v1/elicitations/{created['elicitationId']}/cancel")
    return str(created["elicitationId"])


async def test_a_rotated_secret_signs_with_the_previous_one_for_the_overlap_then_alone(
    deploy_with: Deploy, database_url: str, captured_logs: pytest.LogCaptureFixture
) -> None:
    async with (
        deploy_with(CONNECTOR_DATABASE__URL=database_url, **FAST) as deployment,
        receiving() as receiver,
    ):
        store = deployment.connector.runtime.store
        key = await make_key(store, "agent-a")
        async with api_client(deployment.base_url, key) as api:
            made = (await api.post("/v1/webhooks", json={"url": receiver.url, "description": "bot"})).json()
            webhook_id, first = made["webhookId"], made["secret"]

            # Without a body: the default overlap, 24 hours.
            before = datetime.now(UTC)
            rotated = await api.post(f"/v1/webhooks/{webhook_id}/secret")
            assert rotated.status_code == 200, rotated.text
            second = rotated.json()["secret"]
            assert second.startswith("whsec_") and second != first
            assert {k: v for k, v in rotated.json().items() if k not in ("secret", "previousSecretExpiresAt")} == {
                k: v for k, v in made.items() if k != "secret"
            }
            expires = datetime.fromisoformat(rotated.json()["previousSecretExpiresAt"])
            assert before + timedelta(hours=24) <= expires <= datetime.now(UTC) + timedelta(hours=24)
            assert first not in rotated.text and first.removeprefix("whsec_") not in rotated.text
            assert second not in (await api.get("/v1/webhooks")).text

            # The next delivery carries both signatures, the new one first: either secret alone verifies it.
            one = await end_one_elicitation(api)
            await receiver.wait_until(lambda r: len(r.requests) >= 1)
            overlapping = receiver.requests[-1]
            assert json.loads(overlapping.body)["data"]["elicitationId"] == one
            assert (
                overlapping.headers["webhook-signature"]
                == f"{recompute(second, overlapping)} {recompute(first, overlapping)}"
            )
            assert verifies(first, overlapping) and verifies(second, overlapping)

            # A second rotation in the overlap keeps only the secret current at that moment as the previous one.
            third = (await api.post(f"/v1/webhooks/{webhook_id}/secret", json={"overlapSeconds": 60})).json()["secret"]
            await end_one_elicitation(api)
            await receiver.wait_until(lambda r: len(r.requests) >= 2)
            replaced = receiver.requests[-1]
            assert (
                replaced.headers["webhook-signature"] == f"{recompute(third, replaced)} {recompute(second, replaced)}"
            )
            assert verifies(third, replaced) and verifies(second, replaced) and not verifies(first, replaced)

            # After the overlap (the connector's clock moved on), only the new secret signs.
            deployment.connector.clock.advance(timedelta(seconds=61))
            await end_one_elicitation(api)
            await receiver.wait_until(lambda r: len(r.requests) >= 3)
            after = receiver.requests[-1]
            assert after.headers["webhook-signature"] == recompute(third, after)
            assert verifies(third, after) and not verifies(second, after)

            # An overlap of 0: the old secret stops signing at once.
            zero = await api.post(f"/v1/webhooks/{webhook_id}/secret", json={"overlapSeconds": 0})
            assert zero.status_code == 200 and zero.json()["previousSecretExpiresAt"] is None
            fourth = zero.json()["secret"]
            await end_one_elicitation(api)
            await receiver.wait_until(lambda r: len(r.requests) >= 4)
            last = receiver.requests[-1]
            assert last.headers["webhook-signature"] == recompute(fourth, last)
            assert verifies(fourth, last) and not verifies(third, last)

        assert len(receiver.requests) == 4  # each delivered at its first attempt
        audit = await store.audit.list(event="webhook_secret_rotated")
        assert sorted(a.detail["overlap_seconds"] for a in audit) == [0, 60, 24 * 3600]
        assert {(a.detail["webhook_id"], a.detail["tenant"], a.detail["via"]) for a in audit} == {
            (webhook_id, "agent-a", "api")
        }
        async with store.engine.connect() as conn:
            dump = repr((await conn.execute(select(tables.webhook_endpoints))).all())
            dump += repr((await conn.execute(select(tables.audit_events))).all())
        for secret in (first, second, third, fourth):
            for where in (dump, captured_logs.text):
                assert secret.removeprefix("whsec_") not in where


BAD_ROTATIONS: list[tuple[dict[str, Any] | bytes, str]] = [
    (b"{not json", "bad_request"),
    (b"[60]", "bad_request"),
    ({"overlapSeconds": -1}, "invalid_input"),
    ({"overlapSeconds": 7 * 24 * 3600 + 1}, "invalid_input"),
    ({"overlapSeconds": "60"}, "invalid_input"),
    ({"overlapSeconds": 1.5}, "invalid_input"),
    ({"overlapSeconds": True}, "invalid_input"),
    ({"overlapSeconds": None}, "invalid_input"),
    ({"overlapSeconds": 60, "secret": "whsec_AAAA"}, "invalid_input"),
    ({"overlap": 60}, "invalid_input"),
]


async def endpoint_rows(store: Store) -> list[Any]:
    async with store.engine.connect() as conn:
        return list(
            (await conn.execute(select(tables.webhook_endpoints).order_by(tables.webhook_endpoints.c.id))).all()
        )


async def test_secret_rotations_refused_change_nothing(deploy_with: Deploy, database_url: str) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        store = deployment.connector.runtime.store
        key, other = await make_key(store, "agent-a"), await make_key(store, "agent-b")
        async with api_client(deployment.base_url, key) as api, api_client(deployment.base_url, other) as api_b:
            mine = (await api.post("/v1/webhooks", json={"url": "https://hooks.example.com/a"})).json()
            path = f"/v1/webhooks/{mine['webhookId']}/secret"
            before = await endpoint_rows(store)
            for body, code in BAD_ROTATIONS:
                sent = {"content": body} if isinstance(body, bytes) else {"json": body}
                answer = await api.post(path, **sent)  # type: ignore[arg-type]
                assert 400 <= answer.status_code < 500, (body, answer.text)
                assert answer.json()["error"]["code"] == code, (body, answer.text)
                assert answer.json()["error"]["message"]
            for client, target in ((api_b, path), (api, "/v1/webhooks/wh_nosuch/secret")):
                answer = await client.post(target, json={"overlapSeconds": 60})  # another tenant's, or none
                assert (answer.status_code, answer.json()["error"]["code"]) == (404, "unknown_webhook")
                assert "whsec_" not in answer.text
        async with api_client(deployment.base_url, None) as anonymous:
            answer = await anonymous.post(path)
            assert (answer.status_code, answer.json()["error"]["code"]) == (401, "unauthorized")
        assert await endpoint_rows(store) == before
        assert before[0].previous_secret_ciphertext is None
        assert await store.audit.list(event="webhook_secret_rotated") == []


def run_cli(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), env=env, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


async def test_no_endpoint_costs_no_query_and_one_registered_elsewhere_misses_no_event(
    deploy_with: Deploy, connector_env: dict[str, str]
) -> None:
    async with deploy_with(**FAST) as deployment, receiving() as receiver:
        runtime = deployment.connector.runtime
        assert runtime.webhook_worker is not None
        dispatcher = runtime.webhook_worker.dispatcher
        store = runtime.store
        key = await make_key(store, "bot")
        assert await dispatcher.step() == 0  # no endpoint anywhere: believed for a while, read no more
        # Another process (the CLI) registers one; this replica does not know yet.
        code, secret, _ = await asyncio.to_thread(
            run_cli, {**connector_env, **FAST}, "webhooks", "create", "--tenant", "bot", "--url", receiver.url
        )
        assert code == 0, secret
        async with api_client(deployment.base_url, key) as api:
            created = (await api.post("/v1/elicitations", json=create_body(ALICE))).json()
            await api.post(f"/v1/elicitations/{created['elicitationId']}/cancel")
        assert await dispatcher.step() == 0
        assert await count_rows(store, tables.webhook_deliveries) == 0  # the event waits in the log
        deployment.connector.clock.advance(NO_ENDPOINT_RECHECK)  # this replica reads the endpoints again
        await receiver.wait_until(lambda r: len(r.requests) >= 1)
    (received,) = receiver.requests
    verified = verify_webhook(secret.strip(), received.headers, received.body)
    assert verified["data"]["elicitationId"] == created["elicitationId"]


async def signing_secrets(env: dict[str, str], webhook_id: str) -> list[str]:
    """The secrets a delivery to the endpoint would be signed with now, read as the connector reads them."""
    store = Store.from_url(env["CONNECTOR_DATABASE__URL"])
    try:
        endpoint = await store.webhooks.endpoint(webhook_id)
        assert endpoint is not None
        vault = Vault(KeyRing.from_strings([env["CONNECTOR_VAULT__KEYS"]]))
        endpoints = WebhookEndpoints(store.webhooks, store.outbox, vault, WebhookPolicy(), lambda: datetime.now(UTC))
        return endpoints.signing_secrets(endpoint, datetime.now(UTC))
    finally:
        await store.close()


def test_webhooks_cli_creates_rotates_lists_and_deletes(connector_env: dict[str, str]) -> None:
    env = {**connector_env, "CONNECTOR_WEBHOOKS__ALLOW_PRIVATE_ADDRESSES": "false"}
    migrate(env["CONNECTOR_DATABASE__URL"])
    code, secret, note = run_cli(env, "webhooks", "create", "--tenant", "bot", "--url", "https://hooks.example.com/a")
    assert code == 0 and secret.strip().startswith("whsec_")
    webhook_id = next(word for word in note.split() if word.startswith("wh_"))
    code, listed, _ = run_cli(env, "webhooks", "list", "--tenant", "bot")
    assert code == 0 and webhook_id in listed and "https://hooks.example.com/a" in listed
    assert secret.strip() not in listed and secret.strip().removeprefix("whsec_") not in listed
    code, _, err = run_cli(env, "webhooks", "create", "--tenant", "bot", "--url", "https://10.0.0.1/a")
    assert code == 2 and "private" in err and "Traceback" not in err

    code, rotated, note = run_cli(env, "webhooks", "rotate-secret", webhook_id, "--overlap-seconds", "600")
    assert code == 0 and rotated.strip().startswith("whsec_") and rotated.strip() != secret.strip()
    assert "signs too until" in note and rotated.strip() not in note
    assert asyncio.run(signing_secrets(env, webhook_id)) == [rotated.strip(), secret.strip()]
    code, last, note = run_cli(env, "webhooks", "rotate-secret", webhook_id, "--overlap-seconds", "0")
    assert code == 0 and "no longer signs" in note
    assert asyncio.run(signing_secrets(env, webhook_id)) == [last.strip()]
    code, _, err = run_cli(env, "webhooks", "rotate-secret", webhook_id, "--overlap-seconds", "604801")
    assert code == 2 and "overlap" in err and "Traceback" not in err
    code, _, err = run_cli(env, "webhooks", "rotate-secret", "wh_nosuch")
    assert code == 1 and "no endpoint" in err
    assert asyncio.run(signing_secrets(env, webhook_id)) == [last.strip()]  # the refused ones changed nothing

    assert run_cli(env, "webhooks", "delete", webhook_id)[0] == 0
    code, _, err = run_cli(env, "webhooks", "delete", webhook_id)
    assert code == 1 and "no endpoint" in err
    assert webhook_id not in run_cli(env, "webhooks", "list")[1]


async def test_the_openapi_document_describes_the_secret_rotation(deployment: Deployment) -> None:
    async with api_client(deployment.base_url, None) as api:
        document = (await api.get("/v1/openapi.json")).json()
    validate(document)
    operation = document["paths"]["/v1/webhooks/{webhook_id}/secret"]["post"]
    assert operation["requestBody"]["required"] is False  # an empty body: the default overlap
    assert {"200", "400", "401", "404", "413"} <= set(operation["responses"])
    schemas = document["components"]["schemas"]
    body = schemas["RotateWebhookSecret"]
    assert body["additionalProperties"] is False
    assert (body["properties"]["overlapSeconds"]["minimum"], body["properties"]["overlapSeconds"]["maximum"]) == (
        0,
        7 * 24 * 3600,
    )
    assert {"secret", "previousSecretExpiresAt", "webhookId"} <= set(schemas["WebhookSecretRotated"]["properties"])
    assert "secret" not in schemas["Webhook"]["properties"]
