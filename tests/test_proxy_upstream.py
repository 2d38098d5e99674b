"""The token proxy and `Connector.http()` against a real provider API on loopback that records what it received: the
token reaches the API's host and no other (a redirect is not followed with it), the agent cannot set the API's token
header, what the API answers does not hand the token back, and sizes and times stay within the `[api]` limits."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from service import Identity
from service.core.errors import GrantUnreadable, VaultError
from service.testing import MockKeyedApi
from service.vault import generate_key

from .api_support import make_key, user_headers
from .conftest import Deploy, Deployment, write_catalog
from .sidecar_support import seed_grant, serve_app

USER = Identity("https://login.example.com", "proxied")
TOKEN = "upstream-test-access-token"  # the seeded grant's access token, looked for where it must not be
SLOW_SECONDS = 30.0  # how long the API's slow answers would take: far past every limit the tests set


@dataclass
class Received:
    """What an API on loopback was sent."""

    requests: list[tuple[str, str, list[tuple[str, str]], int]] = field(default_factory=list)

    def headers(self) -> Iterator[tuple[str, str]]:
        for _, _, headers, _ in self.requests:
            yield from headers


def recording_api(received: Received, elsewhere: str) -> Starlette:
    """The provider's API: records every request, and answers by path (`redirect`: to `elsewhere`; `echo`: with a
    cookie and a challenge holding the token it was sent; `refuse`: 401; `refuse-big`: 401 with 200 kB; `missing`:
    404; `broken`: 500; `moved`: to `missing` on the same origin; `big`: 200 kB; `slow`: headers, then 5 bytes every
    0.5 s; `hang`: nothing for SLOW_SECONDS)."""

    async def anything(request: Request) -> Response:
        body = len(await request.body())
        headers = [(name.decode(), value.decode()) for name, value in request.headers.raw]
        query = request.scope["query_string"].decode()
        target = request.scope["raw_path"].decode() + (f"?{query}" if query else "")
        received.requests.append((request.method, target, headers, body))
        what = request.url.path.rsplit("/", 1)[-1]
        if what == "redirect":
            return Response(status_code=302, headers={"location": f"{elsewhere}/landed"})
        if what == "moved":  # on the same origin
            return Response(status_code=302, headers={"location": "missing?moved=1"})
        if what in ("missing", "broken"):
            return JSONResponse({"message": what}, 404 if what == "missing" else 500)
        if what == "big":
            return StreamingResponse(_chunks(20, b"x" * 10_000, 0), headers={"content-length": "200000"})
        if what == "slow":
            return StreamingResponse(_chunks(20, b"x" * 5, 0.5), headers={"content-length": "100"})  # 10 s
        if what == "refuse":
            return JSONResponse({"message": "Bad credentials"}, 401)
        if what == "refuse-big":  # as it comes, with no length declared
            return StreamingResponse(_chunks(20, b"x" * 10_000, 0), status_code=401)
        if what == "hang":  # until the connector closes the connection (the next message is its disconnect)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(request.receive(), SLOW_SECONDS)
        sent = " ".join(value for name, value in headers if name in ("authorization", "x-shop-token", "x-api-key"))
        return JSONResponse(
            {"received": body},
            headers={"set-cookie": f"echo={sent}", "www-authenticate": f'Bearer error="invalid_token", got="{sent}"'},
        )

    return Starlette(routes=[Route("/{rest:path}", anything, methods=["GET", "POST", "PUT", "DELETE", "TRACE"])])


async def _chunks(count: int, chunk: bytes, pause: float) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield chunk
        await asyncio.sleep(pause)


@dataclass
class Rig:
    deployment: Deployment
    key: str
    api: Received  # the provider's API host
    elsewhere: Received  # another origin (another port on loopback)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", **user_headers(USER)}

    async def proxy(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        async with httpx.AsyncClient(timeout=SLOW_SECONDS * 2) as client:
            headers = {**self.headers(), **kwargs.pop("headers", {})}  # type: ignore[dict-item]
            return await client.request(
                method,
                f"{self.deployment.base_url}/v1/proxy/{path}",
                headers=headers,
                **kwargs,  # type: ignore[arg-type]
            )


def api_entries(base: str) -> dict[str, dict[str, object]]:
    """`bearer`: the token in Authorization; `shop`: in the API's own header, as Shopify's entry has it; `keyed`: a
    credential entry's API key in X-Api-Key; `in_query`: one in the query parameter api_token (as Pipedrive's);
    `sited`: as `bearer`, its API base named by a per-connection value (the grant's, so read from its tokens)."""
    bearer = {
        "display_name": "Recorded API",
        "authorization_endpoint": f"{base}/authorize",
        "token_endpoint": f"{base}/token",
        "api_base_url": f"{base}/api",
    }
    shop = {**bearer, "api_token_header": "X-Shop-Token", "api_token_prefix": ""}
    keyed = MockKeyedApi(base_url=f"{base}/api", header="X-Api-Key", template="{key}").catalog_entry()
    in_query = MockKeyedApi(base_url=f"{base}/api", style="query", parameter="api_token").catalog_entry()
    site = {"source": "agent", "pattern": "^[a-z]+$", "description": "the site", "example": "api"}
    sited = {**bearer, "api_base_url": f"{base}/{{site}}", "connection": {"site": site}}
    return {"bearer": bearer, "shop": shop, "keyed": keyed, "in_query": in_query, "sited": sited}


@asynccontextmanager
async def rigged(deploy_with: Deploy, tmp_path: Path, env: dict[str, str], **limits: str) -> AsyncIterator[Rig]:
    """A connector whose providers' API is a recording server on loopback, with a grant of USER's at each (made
    through the key's tenant and through the embedded connector's); `limits`: CONNECTOR_API__* settings."""
    api, elsewhere = Received(), Received()
    async with serve_app(recording_api(elsewhere, "")) as other, serve_app(recording_api(api, other)) as base:
        entries = api_entries(base)
        settings = {f"CONNECTOR_API__{name.upper()}": value for name, value in limits.items()}
        settings["CONNECTOR_PROVIDERS__CATALOG"] = str(write_catalog(tmp_path / "recorded.toml", entries))
        for name in ("bearer", "shop", "sited"):
            settings[f"CONNECTOR_PROVIDER_{name.upper()}_CLIENT_ID"] = "recorded-client"
            settings[f"CONNECTOR_PROVIDER_{name.upper()}_CLIENT_SECRET"] = "recorded-secret"
        async with deploy_with(**settings) as deployment:
            store = deployment.connector.runtime.store
            key = await make_key(store)
            for name, tenant in itertools.product(entries, ("agent-a", "embedded")):
                api_key = TOKEN if name in ("keyed", "in_query") else None
                await seed_grant(store, env["CONNECTOR_VAULT__KEYS"], USER, name, TOKEN, tenant, api_key=api_key)
            yield Rig(deployment, key, api, elsewhere)


@pytest.fixture
async def rig(deploy_with: Deploy, tmp_path: Path, connector_env: dict[str, str]) -> AsyncIterator[Rig]:
    async with rigged(deploy_with, tmp_path, connector_env) as rig:
        yield rig


@pytest.mark.parametrize("provider", ["bearer", "shop", "keyed"])
async def test_the_proxy_returns_a_redirect_and_does_not_follow_it(rig: Rig, provider: str) -> None:
    response = await rig.proxy("GET", f"{provider}/redirect")
    assert response.status_code == 302 and response.headers["location"].endswith("/landed")
    assert [path for _, path, _, _ in rig.api.requests] == ["/api/redirect"]
    assert rig.elsewhere.requests == []


@pytest.mark.parametrize("provider", ["bearer", "shop", "keyed", "in_query"])
@pytest.mark.parametrize("where", ["client", "request"])
async def test_http_follows_a_redirect_elsewhere_without_the_token(rig: Rig, provider: str, where: str) -> None:
    """httpx keeps every header but Authorization on a redirect to another origin: the API's own token header
    (Shopify's X-Shopify-Access-Token, a credential entry's key header) must not go along."""
    on_client = {"follow_redirects": True} if where == "client" else {}
    on_request = {"follow_redirects": True} if where == "request" else {}
    async with rig.deployment.connector.http(USER, provider, **on_client) as api:
        response = await api.get("redirect", **on_request)
    assert response.status_code == 200 and response.url.path == "/landed"
    assert [path for _, path, _, _ in rig.elsewhere.requests] == ["/landed"]
    assert not [value for _, value in rig.elsewhere.headers() if TOKEN in value]
    carried = {"bearer": ("authorization", f"Bearer {TOKEN}"), "shop": ("x-shop-token", TOKEN)}
    if provider != "in_query":
        assert carried.get(provider, ("x-api-key", TOKEN)) in rig.api.requests[0][2]


async def test_a_key_in_the_query_stays_out_of_the_request_lines_httpx_logs(
    rig: Rig, captured_logs: pytest.LogCaptureFixture
) -> None:
    """httpx logs every request URL at INFO; the embedded connector logs through the host application's logging,
    which may well be at INFO."""
    captured_logs.set_level(logging.INFO, logger="httpx")
    async with rig.deployment.connector.http(USER, "in_query") as api:
        assert (await api.get("echo", params={"page": "2"})).status_code == 200
    assert rig.api.requests[-1][1] == f"/api/echo?page=2&api_token={TOKEN}"
    lines = [record.getMessage() for record in captured_logs.records if record.name == "httpx"]
    assert [line for line in lines if "/api/echo" in line] and not [line for line in lines if TOKEN in line]


@pytest.mark.parametrize("provider", ["bearer", "shop", "keyed", "in_query"])
async def test_http_hands_back_requests_without_the_token(rig: Rig, provider: str) -> None:
    """The requests httpx hands the host application (a response's, its history's, its next request, an error's)
    are the ones the auth flow sent, token and key included: `raise_for_status()`'s message names the URL (a key
    in its query), and a host that logs `response.request` would log the secret. The API still receives it."""
    handed: list[httpx.Request] = []
    messages: list[str] = []

    async def host_hook(response: httpx.Response) -> None:  # the host application's own response hook
        handed.append(response.request)

    hooks = {"response": [host_hook]}
    async with rig.deployment.connector.http(USER, provider, event_hooks=hooks) as api:
        for path in ("missing", "broken"):
            response = await api.get(path, params={"page": "2"})
            with pytest.raises(httpx.HTTPStatusError) as raised:
                response.raise_for_status()
            assert str(response.url).endswith(f"/api/{path}?page=2")
            messages.append(str(raised.value))
            handed.append(raised.value.request)
        moved = await api.get("moved", follow_redirects=True)
        assert moved.status_code == 404 and len(moved.history) == 1
        handed.extend([moved.request, moved.history[0].request])
        not_followed = await api.get("moved")
        assert not_followed.next_request is not None
        handed.extend([not_followed.request, not_followed.next_request])
        async with api.stream("POST", "broken", content=b"body") as streamed:
            assert streamed.status_code == 500 and streamed.request.content == b"body"
            handed.append(streamed.request)
        with pytest.raises(httpx.ReadTimeout) as timed_out:
            await api.get("hang", timeout=0.5)
        handed.append(timed_out.value.request)
    shown = [*messages, *(f"{r!r} {r.url} {r.headers!r} {r.headers.raw!r}" for r in handed)]
    assert len(shown) == 2 + len(handed) and not [text for text in shown if TOKEN in text]
    assert len(rig.api.requests) == 7
    for _, target, headers, _ in rig.api.requests:  # each carried it
        if provider == "in_query" and target.endswith("?moved=1"):
            continue  # a redirect httpx follows has the query its Location names, not the one the auth flow wrote
        assert TOKEN in target or [value for _, value in headers if TOKEN in value], target


@pytest.mark.parametrize("provider", ["bearer", "shop", "keyed", "in_query"])
async def test_http_request_hooks_see_requests_without_the_token(rig: Rig, provider: str) -> None:
    """The host application's request hooks run after the auth flow wrote the secret (httpx's docs log
    `request.url` there: a key in the query would be in it). They see the request without it, may change it, and the
    API receives their change and the secret, on a redirect too; a redirect to another origin still goes without."""
    seen: list[str] = []

    async def host_hook(request: httpx.Request) -> None:
        seen.append(f"{request.url} {request.headers.raw!r}")
        request.headers["X-Host-Hook"] = "1"

    async with rig.deployment.connector.http(USER, provider, event_hooks={"request": [host_hook]}) as api:
        assert (await api.get("missing", params={"page": "2"})).status_code == 404  # (echo's cookie holds the token)
        assert (await api.get("moved", follow_redirects=True)).status_code == 404
        assert (await api.get("redirect", follow_redirects=True)).status_code == 200
    assert len(seen) == 5 and not [text for text in seen if TOKEN in text]
    assert "page=2" in seen[0]
    assert [target.split("?")[0] for _, target, _, _ in rig.api.requests] == [
        "/api/missing",
        "/api/moved",
        "/api/missing",
        "/api/redirect",
    ]
    for _, target, headers, _ in rig.api.requests:
        assert ("x-host-hook", "1") in headers
        if provider == "in_query" and target.endswith("?moved=1"):
            continue  # a redirect httpx follows has the query its Location names, not the one the auth flow wrote
        assert TOKEN in target or [value for _, value in headers if TOKEN in value], target
    assert "page=2" in rig.api.requests[0][1]
    (_, _, landed, _) = rig.elsewhere.requests[0]
    assert ("x-host-hook", "1") in landed and not [value for _, value in landed if TOKEN in value]


async def test_the_agent_cannot_set_the_token_header_and_gets_no_token_back(rig: Rig) -> None:
    agents = [("X-Shop-Token", "agent-1"), ("x-shop-token", "agent-2"), ("Authorization", "Bearer agent-3")]
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(
            f"{rig.deployment.base_url}/v1/proxy/shop/echo",
            headers=[*rig.headers().items(), *agents, ("Host", "shop-b.api.example")],  # another virtual host there
        )
    assert response.status_code == 200
    (_, _, sent, _) = rig.api.requests[-1]
    assert [(n, v) for n, v in sent if n in ("x-shop-token", "authorization")] == [("x-shop-token", TOKEN)]
    api = httpx.URL(str(rig.deployment.connector.runtime.providers.catalog.get("shop").api_base_url))
    assert [v for n, v in sent if n == "host"] == [api.netloc.decode()]
    assert TOKEN not in str(response.headers.raw) and TOKEN not in response.text
    trace = await rig.proxy("TRACE", "shop/echo")  # TRACE answers with the request it received, token and all
    assert trace.status_code == 405 and len(rig.api.requests) == 1


async def test_what_proxies_say_of_the_agent_does_not_reach_the_provider(rig: Rig) -> None:
    """The agent's addresses, host names and scheme as its own proxies wrote them are not the provider's to know
    (nor to build its URLs from); the agent's other headers go on."""
    topology = {
        "Forwarded": "for=10.1.2.3;host=agent.internal;proto=http",
        "X-Forwarded-For": "10.1.2.3, 10.0.0.1",
        "X-Forwarded-Host": "agent.internal",
        "X-Forwarded-Proto": "http",
        "X-Forwarded-Port": "8080",
        "X-Forwarded-Prefix": "/agent",
        "X-Real-IP": "10.1.2.3",
        "True-Client-IP": "10.1.2.3",
        "Via": "1.1 agent-gateway.internal",
    }
    answer = await rig.proxy("GET", "bearer/echo", headers={**topology, "X-Request-Id": "kept-1"})
    assert answer.status_code == 200
    (_, _, sent, _) = rig.api.requests[-1]
    assert ("x-request-id", "kept-1") in sent
    assert not [(name, value) for name, value in sent if name in {n.lower() for n in topology}]
    assert not [value for _, value in sent if "10.1.2.3" in value or "internal" in value]


async def test_a_key_the_api_refuses_is_grant_needs_user_and_is_not_sent_again(rig: Rig) -> None:
    refused = await rig.proxy("GET", "keyed/refuse")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "grant_needs_user"
    assert "(key_rejected)" in refused.json()["error"]["message"]
    again = await rig.proxy("GET", "keyed/echo")
    assert again.status_code == 403 and again.json()["error"]["code"] == "grant_needs_user"
    assert [path for _, path, _, _ in rig.api.requests] == ["/api/refuse"]
    assert TOKEN not in refused.text + again.text


@pytest.mark.parametrize("key", ["gone", "k1"])
async def test_a_grant_the_vault_cannot_decrypt_is_503_grant_unreadable(
    rig: Rig, key: str, captured_logs: pytest.LogCaptureFixture
) -> None:
    """A grant under a key no longer in the ring (`gone`), or one that does not decrypt under the ring's key of its
    id (`k1`, another key of that id): the operator's misconfiguration, not the agent's. The proxy answers 503
    grant_unreadable (it was a 500) and logs the grant and its key id; nothing goes to the API. The grants listing
    still lists them (it was a 500 for an entry whose per-connection values it shows: `sited`)."""
    store = rig.deployment.connector.runtime.store
    user = Identity("https://login.example.com", "unreadable")
    other_key = generate_key(key)
    grants = {}
    for name in ("bearer", "keyed", "sited"):
        api_key = TOKEN if name == "keyed" else None
        grants[name] = await seed_grant(store, other_key, user, name, TOKEN, api_key=api_key)
        await seed_grant(store, other_key, user, name, TOKEN, "embedded", api_key=api_key)
    for name, grant in grants.items():
        refused = await rig.proxy("GET", f"{name}/echo", headers=user_headers(user))
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "grant_unreadable" and key not in refused.text
        warned = [
            r.getMessage() for r in captured_logs.records if r.levelno == logging.WARNING and grant.id in r.getMessage()
        ]
        assert len(warned) == 1 and f"key {key}" in warned[0], warned
        assert ("not in the vault's key ring" in warned[0]) == (key == "gone")
        assert grant.token_ciphertext.hex() not in warned[0]
    async with httpx.AsyncClient(timeout=10) as client:  # the listing lists them ("sited" without its values)
        listed = await client.get(
            f"{rig.deployment.base_url}/v1/grants",
            params={"issuer": user.issuer, "subject": user.subject},
            headers={"Authorization": f"Bearer {rig.key}"},
        )
    assert listed.status_code == 200
    assert {g["grantId"] for g in listed.json()["grants"]} == {g.id for g in grants.values()}
    assert not [r for r in captured_logs.records if r.levelno >= logging.ERROR]
    if key == "gone":  # the embedded connector says so when the client is asked for, before any request
        for name in grants:
            with pytest.raises(GrantUnreadable) as raised:
                async with rig.deployment.connector.http(user, name):
                    pass
            assert raised.value.code == "grant_unreadable" and "key gone" in str(raised.value)
    else:  # with its key in the ring, when it is decrypted (for "sited", its API base; else the first request)
        for name in grants:
            with pytest.raises(VaultError):
                async with rig.deployment.connector.http(user, name) as api:
                    await api.get("echo")
    assert rig.api.requests == []


async def test_request_bodies_within_the_limit_pass_and_larger_ones_are_refused(
    deploy_with: Deploy, tmp_path: Path, connector_env: dict[str, str]
) -> None:
    async def chunked(size: int) -> AsyncIterator[bytes]:
        for _ in range(size // 10_000):
            yield b"x" * 10_000

    limits = {"proxy_max_request_bytes": "100000", "proxy_retry_body_bytes": "1000"}
    async with rigged(deploy_with, tmp_path, connector_env, **limits) as rig:
        streamed = await rig.proxy("POST", "bearer/echo", content=b"x" * 80_000)  # over the API's own 64 KiB
        assert streamed.status_code == 200 and streamed.json() == {"received": 80_000}
        for body in (b"x" * 100_001, chunked(200_000)):
            refused = await rig.proxy("POST", "bearer/echo", content=body)
            assert refused.status_code == 413 and refused.json()["error"]["code"] == "body_too_large"
            assert "100000 bytes" in refused.json()["error"]["message"]
        assert [size for _, _, _, size in rig.api.requests] == [80_000]


async def test_a_401_with_a_large_body_is_502_and_the_small_one_is_relayed(
    rig: Rig, captured_logs: pytest.LogCaptureFixture
) -> None:
    """The proxy reads a 401's body whole before it may refresh (and relays it when there is no retry): an error's
    few words, not 200 kB, and not a 500."""
    small = await rig.proxy("GET", "bearer/refuse")  # no refresh token: the API's own 401 comes back
    assert small.status_code == 401 and small.json() == {"message": "Bad credentials"}
    big = await rig.proxy("GET", "bearer/refuse-big")
    assert big.status_code == 502 and big.json()["error"]["code"] == "upstream_unavailable"
    assert [r for r in captured_logs.records if "401 answer cut off" in r.getMessage() and r.levelno == logging.WARNING]
    assert not [r for r in captured_logs.records if r.levelno >= logging.ERROR]
    again = await rig.proxy("GET", "bearer/echo")
    assert again.status_code == 200


@pytest.mark.duration(4)
async def test_answers_are_cut_at_the_size_and_time_limits(
    deploy_with: Deploy, tmp_path: Path, connector_env: dict[str, str]
) -> None:
    limits = {"proxy_timeout_seconds": "1", "proxy_max_seconds": "2", "proxy_max_response_bytes": "100000"}
    async with rigged(deploy_with, tmp_path, connector_env, **limits) as rig:
        with pytest.raises(httpx.RemoteProtocolError):  # the agent cannot take the first 100 kB for the whole
            await rig.proxy("GET", "bearer/big")
        started = time.monotonic()
        hung = await rig.proxy("GET", "bearer/hang")  # no answer: proxy_timeout_seconds
        assert hung.status_code == 504 and hung.json()["error"]["code"] == "upstream_timeout"
        trickled = await rig.proxy("GET", "bearer/slow")  # a byte now and then: proxy_max_seconds
        assert trickled.status_code == 504 and trickled.json()["error"]["code"] == "upstream_timeout"
        assert time.monotonic() - started < 1 + 2 + 3


@pytest.mark.duration(8)
async def test_an_exchange_that_trickles_ends_at_proxy_max_seconds(
    deploy_with: Deploy, tmp_path: Path, connector_env: dict[str, str]
) -> None:
    """Each read and write within proxy_timeout_seconds, the whole past proxy_max_seconds: an API that sends its
    status line (or a 401's body) a byte at a time, or an agent that uploads its body a byte at a time, holds a
    connection of the provider's pool (shared by every tenant) no longer than proxy_max_seconds."""
    answering: set[asyncio.Task[object]] = set()

    async def trickling_api(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answering.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"POST"):
                await reader.read()  # the body, until the connector closes the connection
            refused = b"/refuse " in head  # a 401 (which the connector reads before it may refresh), then its body
            if refused:
                writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 40\r\n\r\n")
            trickled = b"x" * 40 if refused else b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Padding: " + b"x" * 40
            for byte in trickled:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.25)
            writer.write(b"" if refused else b"\r\n\r\nok")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(trickling_api, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    catalog = write_catalog(tmp_path / "trickling.toml", {"bearer": api_entries(base)["bearer"]})
    settings = {
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_PROVIDER_BEARER_CLIENT_ID": "recorded-client",
        "CONNECTOR_PROVIDER_BEARER_CLIENT_SECRET": "recorded-secret",
        "CONNECTOR_API__PROXY_TIMEOUT_SECONDS": "1",
        "CONNECTOR_API__PROXY_MAX_SECONDS": "2",
        "CONNECTOR_API__PROXY_RETRY_BODY_BYTES": "0",
    }
    try:
        async with deploy_with(**settings) as deployment:
            store = deployment.connector.runtime.store
            key = await make_key(store)
            await seed_grant(store, connector_env["CONNECTOR_VAULT__KEYS"], USER, "bearer", TOKEN)
            rig = Rig(deployment, key, Received(), Received())
            for path in ("bearer/anything", "bearer/refuse"):
                started = time.monotonic()
                trickling = await rig.proxy("GET", path)
                assert trickling.status_code == 504 and trickling.json()["error"]["code"] == "upstream_timeout"
                assert time.monotonic() - started < 2 + 2, path
            started = time.monotonic()
            answer = await trickled_upload(rig, "bearer/anything", seconds=8)
            assert answer.startswith(b"HTTP/1.1 504 "), answer
            assert time.monotonic() - started < 2 + 2
    finally:
        server.close()
        for task in answering:
            task.cancel()


async def trickled_upload(rig: Rig, path: str, *, seconds: float) -> bytes:
    """The status line of the proxy's answer to a POST whose chunked body comes a byte every 0.25 s for `seconds`
    (on a socket of its own: an httpx client sends the whole body before it reads the answer)."""
    url = httpx.URL(rig.deployment.base_url)
    assert url.port is not None
    reader, writer = await asyncio.open_connection(url.host, url.port)
    headers = "".join(f"{name}: {value}\r\n" for name, value in rig.headers().items())
    writer.write(f"POST /v1/proxy/{path} HTTP/1.1\r\nHost: {url.netloc.decode()}\r\n{headers}".encode())
    writer.write(b"Transfer-Encoding: chunked\r\n\r\n")

    async def upload() -> None:
        for _ in range(int(seconds / 0.25)):
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.25)

    uploading = asyncio.create_task(upload())
    try:
        return await asyncio.wait_for(reader.readline(), seconds + 5)
    finally:
        uploading.cancel()
        writer.close()
