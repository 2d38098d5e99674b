"""The token proxy: the user's token is injected here and never comes back; paths cannot leave the API base."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from service.testing import ScriptedBrowser

from .api_support import api_client, create_body, make_key, user_headers
from .conftest import Deployment
from .test_flow_end_to_end import connector_log_text


async def authorized_key(deployment: Deployment) -> str:
    """An API key whose tenant has had the local user authorize GitHub (through the API and a browser)."""
    key = await make_key(deployment.connector.runtime.store)
    async with api_client(deployment.base_url, key) as api:
        body = (await api.post("/v1/elicitations", json=create_body(deployment.local_user))).json()
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(body["url"])).status_code == 200
    return key


def refreshes(deployment: Deployment) -> int:
    return sum(1 for r in deployment.provider.token_requests if r.get("grant_type") == "refresh_token")


async def test_proxy_injects_the_token_and_returns_the_provider_answer(
    deployment: Deployment, captured_logs: pytest.LogCaptureFixture
) -> None:
    key = await authorized_key(deployment)
    async with api_client(deployment.base_url, key) as api:
        response = await api.get("/v1/proxy/github/user/repos", headers=user_headers(deployment.local_user))
    assert response.status_code == 200
    assert response.json()[0]["full_name"] == "octocat/hello-world"
    assert deployment.provider.api_calls[-1] == "/api/user/repos"
    text = response.text + json.dumps(dict(response.headers)) + connector_log_text(captured_logs)
    for secret in deployment.provider.secrets_issued():
        assert secret not in text


async def test_a_401_triggers_one_refresh_and_one_retry(deployment: Deployment) -> None:
    key = await authorized_key(deployment)
    deployment.provider.expire_access_tokens()  # the provider no longer accepts the stored token
    before = len(deployment.provider.api_calls)
    async with api_client(deployment.base_url, key) as api:
        response = await api.get("/v1/proxy/github/user", headers=user_headers(deployment.local_user))
    assert response.status_code == 200 and response.json()["login"] == "octocat"
    assert refreshes(deployment) == 1
    assert deployment.provider.api_calls[before:] == ["/api/user", "/api/user"]  # the 401, then the retry


async def test_a_401_and_a_refused_refresh_say_the_user_must_authorize_again_and_why(deployment: Deployment) -> None:
    key = await authorized_key(deployment)
    deployment.provider.expire_access_tokens()
    deployment.provider.revoke_refresh_tokens()  # the grant cannot be renewed
    before = len(deployment.provider.api_calls)
    async with api_client(deployment.base_url, key) as api:
        response = await api.get("/v1/proxy/github/user", headers=user_headers(deployment.local_user))
    assert response.status_code == 403 and response.json()["error"]["code"] == "grant_needs_user"
    assert "(revoked): Mock Provider access was revoked" in response.json()["error"]["message"]
    assert refreshes(deployment) == 1  # tried once, refused
    assert deployment.provider.api_calls[before:] == ["/api/user"]  # no retry without a new token


@pytest.mark.parametrize(
    "path",
    [
        "../token",
        "%2e%2e/token",
        "user/..%2F..%2Ftoken",
        "%2F%2Fevil.example/x",
        "user/%2e%2e/%2e%2e/token",
        "..\\token",
        "user%00/repos",
        "%2Fetc/passwd",
    ],
)
async def test_a_path_that_leaves_the_api_base_is_refused_before_sending(deployment: Deployment, path: str) -> None:
    key = await authorized_key(deployment)
    calls, tokens = len(deployment.provider.api_calls), len(deployment.provider.token_requests)
    async with httpx.AsyncClient(timeout=10) as raw:
        # Sent byte for byte: httpx would otherwise normalise the dot segments away before they reach us.
        url = httpx.URL(deployment.base_url).copy_with(raw_path=f"/v1/proxy/github/{path}".encode())
        response = await raw.get(url, headers={"Authorization": f"Bearer {key}", **user_headers(deployment.local_user)})
    assert response.status_code in (400, 404), response.text
    assert (len(deployment.provider.api_calls), len(deployment.provider.token_requests)) == (calls, tokens)


async def test_headers_the_provider_must_not_see_are_stripped(
    deployment: Deployment, respx_router: respx.MockRouter
) -> None:
    seen: list[httpx.Request] = []

    def echo(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            json={"ok": True},
            headers={
                "Set-Cookie": "provider=1",
                "Connection": "close, X-Hop",
                "X-Hop": "1",
                "X-Kept": "yes",
                "Date": "Mon, 01 Jan 2024 00:00:00 GMT",
            },
        )

    respx_router.route(host="github.mock-provider.test", path="/api/echo").mock(side_effect=echo)
    key = await authorized_key(deployment)
    async with api_client(deployment.base_url, key) as api:
        response = await api.post(
            "/v1/proxy/github/echo?x=1&y=%2F",
            content=b'{"hello": "world"}',
            headers={
                **user_headers(deployment.local_user),
                "Cookie": "agent=secret",
                "Connection": "keep-alive, X-Agent-Hop",
                "X-Agent-Hop": "1",
                "Proxy-Authorization": "Basic abc",
                "X-Custom": "kept",
                "Content-Type": "application/json",
            },
        )
    assert response.status_code == 200 and response.headers["x-kept"] == "yes"
    assert "set-cookie" not in response.headers and "x-hop" not in response.headers
    (date,) = response.headers.get_list("date")  # the sidecar's own: one Date field, not two
    assert not date.startswith("Mon, 01 Jan 2024")
    (sent,) = seen
    assert sent.url.host == "github.mock-provider.test" and sent.url.raw_path == b"/api/echo?x=1&y=%2F"
    assert sent.content == b'{"hello": "world"}'
    assert sent.headers["authorization"] == f"Bearer {deployment.provider.issued_access_tokens[-1]}"
    assert sent.headers["x-custom"] == "kept" and sent.headers["content-type"] == "application/json"
    for name in ("cookie", "x-agent-hop", "proxy-authorization", "connector-user-issuer", "connector-user-subject"):
        assert name not in sent.headers, name
    assert key not in json.dumps(dict(sent.headers))


async def test_a_cookie_the_provider_sets_is_not_sent_on_later_requests(
    deployment: Deployment, respx_router: respx.MockRouter
) -> None:
    """The provider's client is shared by every user: a cookie set in answer to one user's call must not ride on
    the next call, whoever makes it (nor on a token request)."""
    cookies: list[str | None] = []

    def session(request: httpx.Request) -> httpx.Response:
        cookies.append(request.headers.get("cookie"))
        return httpx.Response(200, json={"ok": True}, headers={"Set-Cookie": "provider_session=user-a; Path=/"})

    respx_router.route(host="github.mock-provider.test", path="/api/session").mock(side_effect=session)
    key = await authorized_key(deployment)
    async with api_client(deployment.base_url, key) as api:
        for _ in range(3):
            response = await api.get("/v1/proxy/github/session", headers=user_headers(deployment.local_user))
            assert response.status_code == 200 and "set-cookie" not in response.headers
    assert cookies == [None, None, None]


async def test_the_agent_request_is_relayed_without_client_defaults(
    deployment: Deployment, respx_router: respx.MockRouter
) -> None:
    """What the provider gets is the agent's request: an agent that asked for no compression (curl) gets none, as
    the sidecar's HTTP client would otherwise ask for gzip on its behalf; a request without User-Agent gets the
    sidecar's (GitHub refuses requests without one)."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    respx_router.route(host="github.mock-provider.test", path="/api/plain").mock(side_effect=answer)
    key = await authorized_key(deployment)
    async with api_client(deployment.base_url, key) as api:
        for name in ("accept-encoding", "accept", "user-agent"):
            del api.headers[name]
        assert (await api.get("/v1/proxy/github/plain", headers=user_headers(deployment.local_user))).is_success
        gzip_ok = {**user_headers(deployment.local_user), "Accept-Encoding": "gzip", "User-Agent": "my-agent/1"}
        assert (await api.get("/v1/proxy/github/plain", headers=gzip_ok)).is_success
    bare, asked = seen
    assert "accept-encoding" not in bare.headers and "accept" not in bare.headers
    assert bare.headers["user-agent"].startswith("acp-connector/")
    assert (asked.headers["accept-encoding"], asked.headers["user-agent"]) == ("gzip", "my-agent/1")


async def test_refusals_before_anything_is_sent(deployment: Deployment) -> None:
    store = deployment.connector.runtime.store
    key = await make_key(store)
    only_gitlab = await make_key(store, "agent-g", providers=["gitlab"])
    user = user_headers(deployment.local_user)
    async with api_client(deployment.base_url, key) as api:
        no_grant = await api.get("/v1/proxy/github/user", headers=user)
        assert no_grant.status_code == 403 and no_grant.json()["error"]["code"] == "no_grant"
        no_user = await api.get("/v1/proxy/github/user")
        assert no_user.status_code == 400 and no_user.json()["error"]["code"] == "invalid_input"
        unknown = await api.get("/v1/proxy/nosuch/user", headers=user)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_provider"
    async with api_client(deployment.base_url, only_gitlab) as api:
        refused = await api.get("/v1/proxy/github/user", headers=user)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "provider_not_allowed"
    async with api_client(deployment.base_url, None) as anonymous:
        assert (await anonymous.get("/v1/proxy/github/user", headers=user)).status_code == 401
    assert deployment.provider.api_calls == []
