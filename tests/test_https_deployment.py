"""The https deployment variant: `public_base_url` is https, so the binding cookie is `__Host-` prefixed and
Secure, and every answer carries HSTS. The connector still listens on plain loopback (as behind a TLS proxy);
the test browser speaks to the public https origin through a transport that delivers those requests to the
loopback port, so its cookie jar applies the real Secure and host rules.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from service.testing import ScriptedBrowser

from .conftest import Deployment
from .flow_support import asking

# "lookalike" is "c\u043ennector.localhost": a Cyrillic o among Latin letters.
PUBLIC_HOSTS = {"plain": "localhost", "lookalike": "xn--cnnector-nbh.localhost"}


@pytest.fixture(params=sorted(PUBLIC_HOSTS))
def public_host(request: pytest.FixtureRequest) -> str:
    return PUBLIC_HOSTS[request.param]


@pytest.fixture
def connector_env(
    connector_env: dict[str, str],
    loopback_socket: socket.socket,
    public_host: str,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, str]:
    port = loopback_socket.getsockname()[1]
    env = {**connector_env, "CONNECTOR_PUBLIC_BASE_URL": f"https://{public_host}:{port}"}
    monkeypatch.setenv("CONNECTOR_PUBLIC_BASE_URL", env["CONNECTOR_PUBLIC_BASE_URL"])
    return env


class ToLoopback(httpx.AsyncBaseTransport):
    """Sends requests for the public https origin to the loopback listener (TLS ends before the connector)."""

    def __init__(self, public: httpx.URL, port: int) -> None:
        self.public = public
        self.port = port
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == self.public.host and request.url.port == self.public.port:
            request = httpx.Request(
                request.method,
                request.url.copy_with(scheme="http", host="127.0.0.1", port=self.port),
                headers=request.headers,
                stream=request.stream,
                extensions=request.extensions,
            )
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def browser_for(deployment: Deployment, loopback_socket: socket.socket) -> ScriptedBrowser:
    return ScriptedBrowser(transport=ToLoopback(httpx.URL(deployment.base_url), loopback_socket.getsockname()[1]))


async def test_https_deployment_cookie_and_hsts(
    deployment: Deployment, loopback_socket: socket.socket, public_host: str
) -> None:
    assert deployment.base_url.startswith("https://")
    async with asking(deployment) as ask, browser_for(deployment, loopback_socket) as browser:
        pending = await ask()
        assert pending.url.startswith(deployment.base_url + "/connect/")
        page = await browser.get(pending.url)
        assert page.status_code == 200, page.text
        cookies = page.headers.get_list("set-cookie")
        assert len(cookies) == 1
        name_value, *attributes = [part.strip() for part in cookies[0].split(";")]
        assert name_value.split("=", 1)[0] == "__Host-connector-browser"
        flags = {a.split("=")[0].lower(): (a.split("=", 1)[1] if "=" in a else True) for a in attributes}
        # __Host- rules: Secure, Path=/, no Domain. Plus HttpOnly and SameSite=Lax.
        assert flags.get("secure") is True and flags.get("path") == "/" and "domain" not in flags
        assert flags.get("httponly") is True and str(flags.get("samesite")).lower() == "lax"
        hsts = page.headers["strict-transport-security"]
        assert "max-age=" in hsts and int(hsts.split("max-age=")[1].split(";")[0]) >= 31536000
        # The whole flow works over the https origin; the callback is the https redirect URI.
        final = await browser.follow(await browser.submit(page, "continue"))
        assert final.status_code == 200, final.text
        assert "strict-transport-security" in final.headers
        assert (await pending.outcome()).ok
        callback_requests = [r for r in browser.responses if "/callback/github" in r.request.url.path]
        assert str(callback_requests[0].request.url).startswith(f"{deployment.base_url}/callback/github?")
        # The Secure cookie is never sent over plain http: a browser on http:// has no binding.
        secure = browser.client.build_request("GET", f"{deployment.base_url}/connect/x")
        assert "__Host-connector-browser=" in secure.headers.get("cookie", "")
        plain = httpx.URL(deployment.base_url).copy_with(scheme="http")
        assert "cookie" not in browser.client.build_request("GET", str(plain.join("/connect/x"))).headers
    if public_host != "localhost":
        # The public host itself is a look-alike: the consent page warned about it.
        assert "this page&#39;s address" in page.text or "this page's address" in page.text
        assert "mixes letters from different alphabets" in page.text
    else:
        assert 'class="warning"' not in page.text
