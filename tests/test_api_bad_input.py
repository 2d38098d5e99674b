"""Bad input on every `/v1` route: a 4xx with a stable code and a sentence, never a 500, nothing written."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from service.store import tables

from .api_support import api_client, create_body, make_key
from .conftest import Deploy, Deployment, fresh_postgres_database

COUNTED = (
    tables.elicitations,
    tables.api_elicitations,
    tables.grants,
    tables.oauth_flows,
    tables.api_keys,
    tables.webhook_endpoints,
)


async def row_counts(deployment: Deployment) -> dict[str, int]:
    async with deployment.connector.runtime.store.engine.connect() as conn:
        return {t.name: (await conn.execute(select(func.count()).select_from(t))).scalar_one() for t in COUNTED}


def bad_requests(eid: str, user: dict[str, str]) -> list[tuple[str, str, dict[str, Any], str]]:
    """(method, path, httpx keyword arguments, expected error code)."""
    valid = create_body_dict(user)
    big = {**valid, "message": "x" * 20000}
    return [
        ("POST", "/v1/elicitations", {"content": b"{not json"}, "bad_request"),
        ("POST", "/v1/elicitations", {"content": b"[1, 2]"}, "bad_request"),
        ("POST", "/v1/elicitations", {"content": b"\xff\xfe\x00"}, "bad_request"),
        ("POST", "/v1/elicitations", {"content": b""}, "bad_request"),
        ("POST", "/v1/elicitations", {"json": {**valid, "surprise": 1}}, "invalid_input"),
        ("POST", "/v1/elicitations", {"json": {k: v for k, v in valid.items() if k != "user"}}, "invalid_input"),
        ("POST", "/v1/elicitations", {"json": {**valid, "provider": "GitHub!"}}, "invalid_input"),
        ("POST", "/v1/elicitations", {"json": {**valid, "provider": "g" * 100}}, "invalid_input"),
        ("POST", "/v1/elicitations", {"json": {**valid, "scope": {}}}, "invalid_input"),
        (
            "POST",
            "/v1/elicitations",
            {"json": {**valid, "scope": {"sessionId": "s", "requestId": 1}}},
            "invalid_input",
        ),
        (
            "POST",
            "/v1/elicitations",
            {"json": {**valid, "scope": {"toolCallId": "t", "requestId": 1}}},
            "invalid_input",
        ),
        ("POST", "/v1/elicitations", {"json": {**valid, "scope": {"requestId": True}}}, "invalid_input"),
        ("POST", "/v1/elicitations", {"json": {**valid, "scopes": "repo"}}, "invalid_input"),
        ("POST", "/v1/elicitations", {"json": {**valid, "scopes": ["a b"]}}, "invalid_input"),
        (
            "POST",
            "/v1/elicitations",
            {"json": {**valid, "user": {"issuer": "x\x00y", "subject": "s"}}},
            "invalid_input",
        ),
        (
            "POST",
            "/v1/elicitations",
            {"json": {**valid, "user": {"issuer": "i" * 600, "subject": "s"}}},
            "invalid_input",
        ),
        ("POST", "/v1/elicitations", {"json": {**valid, "connectionId": "c\x00"}}, "invalid_input"),
        ("POST", "/v1/elicitations", {"content": json.dumps(big).encode()}, "body_too_large"),
        ("POST", "/v1/elicitations", {"json": {**valid, "provider": "nosuch"}}, "unknown_provider"),
        ("POST", "/v1/elicitations", {"json": valid, "headers": {"Idempotency-Key": "bad key\x01"}}, "invalid_input"),
        ("GET", "/v1/elicitations/nosuchid", {}, "unknown_elicitation"),
        ("GET", "/v1/elicitations/" + "a" * 5000, {}, "invalid_input"),
        ("GET", "/v1/elicitations/%00", {}, "invalid_input"),
        ("GET", "/v1/elicitations/" + "a" * 65, {}, "invalid_input"),
        ("GET", "/v1/elicitations/..%2f..%2fetc", {}, "not_found"),
        ("GET", f"/v1/elicitations/{eid}?wait=abc", {}, "invalid_input"),
        ("GET", f"/v1/elicitations/{eid}?wait=-1", {}, "invalid_input"),
        ("GET", f"/v1/elicitations/{eid}?wait=nan", {}, "invalid_input"),
        ("GET", f"/v1/elicitations/{eid}?wait=1&wait=2", {}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/answer", {"json": {"action": "maybe"}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/answer", {"json": {"action": "client_error"}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/answer", {"json": {"action": "accept", "code": 1}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/answer", {"json": {"action": "decline", "message": "x"}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/answer", {"json": {"action": "cancel", "code": 1}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/answer", {"json": {"action": "accept", "extra": 1}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/answer", {"content": b"accept"}, "bad_request"),
        ("POST", "/v1/elicitations/nosuchid/answer", {"json": {"action": "accept"}}, "unknown_elicitation"),
        ("POST", "/v1/elicitations/nosuchid/cancel", {}, "unknown_elicitation"),
        ("POST", f"/v1/elicitations/{eid}/cancel", {"json": {"cause": "bored"}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/cancel", {"json": {"cause": "agent", "why": 1}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/cancel", {"json": {"requestCancelled": "yes"}}, "invalid_input"),
        ("POST", f"/v1/elicitations/{eid}/cancel", {"content": b"agent"}, "bad_request"),
        ("POST", f"/v1/elicitations/{eid}/cancel", {"content": json.dumps(big).encode()}, "body_too_large"),
        ("PUT", f"/v1/elicitations/{eid}", {}, "method_not_allowed"),
        ("DELETE", "/v1/elicitations", {}, "method_not_allowed"),
        ("GET", "/v1/grants", {}, "invalid_input"),
        ("GET", "/v1/grants?issuer=a&subject=b&provider=NOPE!", {}, "unknown_provider"),
        ("GET", "/v1/grants?issuer=a%00&subject=b", {}, "invalid_input"),
        ("GET", "/v1/grants?issuer=&subject=", {}, "invalid_input"),
        ("GET", "/v1/grants?issuer=a&subject=", {}, "invalid_input"),
        ("GET", "/v1/grants?issuer=%20&subject=b", {}, "invalid_input"),
        (
            "GET",
            "/v1/proxy/github/user",
            {"headers": {"Connector-User-Issuer": "a", "Connector-User-Subject": ""}},
            "invalid_input",
        ),
        ("POST", "/v1/elicitations", {"json": {**valid, "user": {"issuer": " ", "subject": "s"}}}, "invalid_input"),
        ("DELETE", "/v1/grants/nosuch", {}, "unknown_grant"),
        ("DELETE", "/v1/grants/%00", {}, "invalid_input"),
        ("GET", "/v1/proxy/github/user", {}, "invalid_input"),
        ("GET", "/v1/proxy/NOPE!/user", {}, "unknown_provider"),
        ("POST", "/v1/webhooks/wh_nosuch/secret", {}, "unknown_webhook"),
        ("POST", "/v1/webhooks/wh_nosuch/secret", {"json": {"overlapSeconds": 60}}, "unknown_webhook"),
        ("POST", "/v1/webhooks/wh_nosuch/secret", {"json": {"overlapSeconds": -1}}, "invalid_input"),
        ("POST", "/v1/webhooks/wh_nosuch/secret", {"json": {"overlapSeconds": 10**9}}, "invalid_input"),
        ("POST", "/v1/webhooks/wh_nosuch/secret", {"json": {"overlapSeconds": "1"}}, "invalid_input"),
        ("POST", "/v1/webhooks/wh_nosuch/secret", {"json": {"secret": "whsec_x"}}, "invalid_input"),
        ("POST", "/v1/webhooks/wh_nosuch/secret", {"content": b"60"}, "bad_request"),
        ("POST", "/v1/webhooks/wh_nosuch/secret", {"content": json.dumps(big).encode()}, "body_too_large"),
        ("POST", "/v1/webhooks/%00/secret", {}, "invalid_input"),
        ("GET", "/v1/webhooks/wh_nosuch/secret", {}, "method_not_allowed"),
        ("GET", "/v1/nothing-here", {}, "not_found"),
    ]


def create_body_dict(user: dict[str, str]) -> dict[str, Any]:
    return {
        "user": user,
        "provider": "github",
        "scopes": ["repo"],
        "scope": {"sessionId": "sess-1"},
    }


async def test_bad_input_on_every_route_is_a_4xx_with_a_stable_code_and_writes_nothing(
    deployment: Deployment,
) -> None:
    store = deployment.connector.runtime.store
    key = await make_key(store)
    user = {"issuer": deployment.local_user.issuer, "subject": deployment.local_user.subject}
    async with api_client(deployment.base_url, key) as api:
        created = await api.post("/v1/elicitations", json=create_body(deployment.local_user))
        eid = created.json()["elicitationId"]
        before = await row_counts(deployment)
        for method, path, kwargs, code in bad_requests(eid, user):
            response = await api.request(method, path, **kwargs)
            assert 400 <= response.status_code < 500, (method, path, response.status_code, response.text)
            error = response.json()["error"]
            assert error["code"] == code, (method, path, error)
            assert error["message"] and "Traceback" not in response.text
        # Double answers: the first counts, the second is refused and changes nothing.
        assert (await api.post(f"/v1/elicitations/{eid}/answer", json={"action": "accept"})).status_code == 200
        status_after_first = (await api.get(f"/v1/elicitations/{eid}")).json()["status"]
        second = await api.post(f"/v1/elicitations/{eid}/answer", json={"action": "decline"})
        assert second.status_code == 409 and second.json()["error"]["code"] == "already_answered"
        assert (await api.get(f"/v1/elicitations/{eid}")).json()["status"] == status_after_first == "consented"
    assert await row_counts(deployment) == before
    async with api_client(deployment.base_url, None) as anonymous:
        for method, path, kwargs, _code in bad_requests(eid, user):
            response = await anonymous.request(method, path, **kwargs)
            if path.startswith("/v1/nothing") or response.status_code == 405 or "%2f" in path:
                continue  # no route: nothing to authenticate
            # The input layer refuses a malformed address before anything else; everything else needs a key.
            code = response.json()["error"]["code"]
            assert (response.status_code, code) in ((401, "unauthorized"), (400, "invalid_input")), path
    assert await row_counts(deployment) == before


def _fuzz_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 2**63, 1.5, float("1e308"), -(2**53)])
    if kind == 3:
        return "".join(
            chr(rng.choice([0, 10, 0x7F, 0x202E, 0x1F600, rng.randrange(32, 127)])) for _ in range(rng.randrange(0, 40))
        )
    if kind == 4:
        return rng.choice(["accept", "decline", "cancel", "client_error", "github", "sess-1", "", "x" * 300])
    if kind == 5:
        return "y" * rng.choice([1, 255, 256, 513, 5000])
    if kind == 6:
        return [_fuzz_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    keys = [
        "user",
        "provider",
        "scopes",
        "scope",
        "message",
        "connectionId",
        "action",
        "code",
        "issuer",
        "subject",
        "sessionId",
        "toolCallId",
        "requestId",
        "x",
    ]
    return {rng.choice(keys): _fuzz_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def _fuzz_request(rng: random.Random, eid: str, key: str) -> tuple[str, str, dict[str, Any]]:
    ids = [eid, "nosuch", "%00", "a" * 300, "..", "%2e%2e", "%F0%9F%98%80", "' OR 1=1 --"]
    paths = [
        "/v1/elicitations",
        f"/v1/elicitations/{rng.choice(ids)}",
        f"/v1/elicitations/{rng.choice(ids)}/answer",
        f"/v1/elicitations/{rng.choice(ids)}/cancel",
        f"/v1/elicitations/{rng.choice(ids)}?wait={rng.choice(['0', '0.01', 'x', '-3', '1e9', ''])}",
        f"/v1/grants?issuer={rng.choice(ids)}&subject={rng.choice(ids)}",
        f"/v1/grants/{rng.choice(ids)}",
        f"/v1/proxy/{rng.choice(['github', 'nosuch', '', '%00'])}/{rng.choice(ids)}",
    ]
    headers: dict[str, str] = {}
    auth = rng.randrange(4)
    if auth:
        headers["Authorization"] = rng.choice([f"Bearer {key}", "Bearer acpk_x", "Basic abc", f"bearer {key}"])
    if rng.random() < 0.3:
        headers["Connector-User-Issuer"] = rng.choice(["https://login.example.com", "x" * 600, ""])
        headers["Connector-User-Subject"] = rng.choice(["alice", "bob", ""])
    if rng.random() < 0.1:
        headers["Idempotency-Key"] = rng.choice(["k1", "k" * 300, "sp ace"])
    body = rng.random()
    kwargs: dict[str, Any] = {"headers": headers}
    if body < 0.5:
        kwargs["content"] = json.dumps(_fuzz_value(rng), allow_nan=True).encode()
    elif body < 0.6:
        kwargs["content"] = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
    method = rng.choice(["GET", "POST", "POST", "DELETE", "PUT", "PATCH"])
    return method, rng.choice(paths), kwargs


async def test_fuzz_gives_no_server_errors(deployment: Deployment) -> None:
    await fuzz(deployment, seed=15, requests=1000)


@pytest.mark.duration(3)
async def test_fuzz_on_postgresql_gives_no_server_errors_and_writes_nothing_it_refused(deploy_with: Deploy) -> None:
    """PostgreSQL refuses what SQLite lets through (NUL bytes, overlong values): the same pass there."""
    async with fresh_postgres_database(migrated=True) as url, deploy_with(CONNECTOR_DATABASE__URL=url) as deployment:
        await fuzz(deployment, seed=16, requests=1000)


async def fuzz(deployment: Deployment, *, seed: int, requests: int) -> None:
    rng = random.Random(seed)
    key = await make_key(deployment.connector.runtime.store)
    async with api_client(deployment.base_url, key) as api:
        eid = (await api.post("/v1/elicitations", json=create_body(deployment.local_user))).json()["elicitationId"]
    before = await row_counts(deployment)
    statuses: dict[int, int] = {}
    created = 0
    async with httpx.AsyncClient(base_url=deployment.base_url, timeout=30) as raw:
        for _ in range(requests):
            method, path, kwargs = _fuzz_request(rng, eid, key)
            response = await raw.request(method, path, **kwargs)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (method, path, kwargs, response.status_code, response.text)
            created += response.status_code == 201
    assert sum(count for status, count in statuses.items() if 400 <= status < 500) > requests * 0.6
    # Only what was accepted was written: at most one elicitation (and its API row) per 201.
    after = await row_counts(deployment)
    assert after["elicitations"] - before["elicitations"] == created
    assert after["api_elicitations"] - before["api_elicitations"] == created
    assert after["grants"] == before["grants"] and after["api_keys"] == before["api_keys"]
