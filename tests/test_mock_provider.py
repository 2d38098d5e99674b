"""The mock provider behaves the same in-process (respx) and over loopback HTTP (ASGI under uvicorn)."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import json
import os
import socket
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import respx

from service.cli import main
from service.oauth import basic_credentials
from service.testing import MockOAuthProvider, MockOIDCProvider

from .identity_support import logging_restored

REDIRECT = "http://127.0.0.1:9/callback/github"
REPO = Path(__file__).resolve().parents[1]


@asynccontextmanager
async def _in_process(provider: MockOAuthProvider) -> AsyncIterator[None]:
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as router:
        provider.install(router)
        yield


@asynccontextmanager
async def _over_http(provider: MockOAuthProvider) -> AsyncIterator[None]:
    async with provider.serve_http():
        yield


@pytest.mark.parametrize("transport", [_in_process, _over_http])
async def test_code_flow_with_pkce_then_api(transport) -> None:  # type: ignore[no-untyped-def]
    provider = MockOAuthProvider()
    verifier = "v" * 64
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    async with transport(provider), httpx.AsyncClient() as http:
        entry = provider.catalog_entry()
        authorize = await http.get(
            entry["authorization_endpoint"],
            params={
                "client_id": provider.client_id,
                "redirect_uri": REDIRECT,
                "response_type": "code",
                "state": "s1",
                "code_challenge": challenge,
                "code_challenge_method": "S256",
                "scope": "read:user repo",
            },
        )
        assert authorize.status_code == 302
        query = parse_qs(urlsplit(authorize.headers["location"]).query)
        assert query["state"] == ["s1"]
        form = {"grant_type": "authorization_code", "code": query["code"][0], "redirect_uri": REDIRECT}
        auth = (provider.client_id, provider.client_secret)
        bad = await http.post(entry["token_endpoint"], data={**form, "code_verifier": "w" * 64}, auth=auth)
        assert bad.status_code == 400 and bad.json()["error"] == "invalid_grant"  # PKCE checked, code now used
        assert (await http.post(entry["token_endpoint"], data={**form, "code_verifier": verifier}, auth=auth)).json()[
            "error"
        ] == "invalid_grant"  # single use
        token = await _fresh_token(http, provider, challenge, verifier)
        repos = await http.get(f"{entry['api_base_url']}/user/repos", headers={"Authorization": f"Bearer {token}"})
        assert repos.status_code == 200 and repos.json() == provider.repos
        denied = await http.get(f"{entry['api_base_url']}/user", headers={"Authorization": "Bearer nope"})
        assert denied.status_code == 401
    assert provider.api_calls == ["/api/user/repos", "/api/user"]


async def _fresh_token(http: httpx.AsyncClient, provider: MockOAuthProvider, challenge: str, verifier: str) -> str:
    entry = provider.catalog_entry()
    authorize = await http.get(
        entry["authorization_endpoint"],
        params={
            "client_id": provider.client_id,
            "redirect_uri": REDIRECT,
            "response_type": "code",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        },
    )
    code = parse_qs(urlsplit(authorize.headers["location"]).query)["code"][0]
    answer = await http.post(
        entry["token_endpoint"],
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT,
            "code_verifier": verifier,
            "client_id": provider.client_id,
            "client_secret": provider.client_secret,
        },
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["access_token"])


async def test_served_provider_moves_its_base_url_to_loopback() -> None:
    provider = MockOAuthProvider()
    async with provider.serve_http() as base_url, httpx.AsyncClient() as http:
        assert base_url == provider.base_url and urlsplit(base_url).hostname == "127.0.0.1"
        assert provider.catalog_entry()["token_endpoint"] == f"{base_url}/token"
        missing = await http.get(f"{base_url}/nowhere")
        assert missing.status_code == 404


async def test_served_provider_refuses_a_non_loopback_address() -> None:
    with pytest.raises(ValueError, match="loopback"):
        async with MockOAuthProvider().serve_http(host="0.0.0.0"):  # noqa: S104 - the point of the test
            pass


def test_cli_mock_provider_needs_the_client_credentials(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CONNECTOR_PROVIDER_GITHUB_CLIENT_ID", raising=False)
    monkeypatch.delenv("CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET", raising=False)
    with logging_restored():  # the CLI sends logs to this test's captured stderr
        assert main(["mock-provider", "--port", "0"]) == 2
    assert "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID" in capsys.readouterr().err
    monkeypatch.setenv("CONNECTOR_PROVIDER_GITHUB_CLIENT_ID", "cid")
    monkeypatch.setenv("CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET", "a-secret-value")
    with logging_restored():
        assert main(["mock-provider", "--host", "192.0.2.1", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "loopback" in err and "a-secret-value" not in err


def _accepted_socket_nodelay(server_address: tuple[str, int], client: socket.socket) -> int:
    """TCP_NODELAY of the server's end of `client`'s connection, read from the kernel through this process's fds.

    The server runs in this process, so its accepted socket is one of our file descriptors: the one whose local
    address is the server's and whose peer is `client`. Socket options belong to the socket, not the descriptor,
    so a duplicate descriptor reads the server's setting.
    """
    peer = client.getsockname()
    for fd in sorted(int(name) for name in os.listdir("/proc/self/fd")):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            candidate = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with candidate:
            try:
                if candidate.getsockname()[:2] == server_address and candidate.getpeername()[:2] == peer[:2]:
                    return candidate.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            except OSError:
                continue
    raise AssertionError(f"no accepted connection from {peer} to {server_address} in this process")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads this process's descriptors from /proc")
async def test_served_provider_sets_tcp_nodelay_on_accepted_connections() -> None:
    """Without TCP_NODELAY every keep-alive request stalls ~40 ms (Nagle meets delayed ACK): check the option."""
    provider = MockOAuthProvider()
    async with provider.serve_http() as base_url:
        address = (urlsplit(base_url).hostname or "", urlsplit(base_url).port or 0)
        reader, writer = await asyncio.open_connection(*address)
        try:
            writer.write(f"GET /nowhere HTTP/1.1\r\nHost: {address[0]}\r\n\r\n".encode())
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 404")  # accepted and answered
            assert _accepted_socket_nodelay(address, writer.get_extra_info("socket")) != 0
        finally:
            writer.close()
            await writer.wait_closed()


async def _code(http: httpx.AsyncClient, provider: MockOAuthProvider, scope: str, prompt: str | None = None) -> str:
    verifier = "v" * 64
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    params = {
        "client_id": provider.client_id,
        "redirect_uri": REDIRECT,
        "response_type": "code",
        "state": "s",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "scope": scope,
        **({"prompt": prompt} if prompt else {}),
    }
    answer = await http.get(f"{provider.base_url}/authorize", params=params)
    return parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]


def _form(code: str) -> dict[str, str]:
    return {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "code_verifier": "v" * 64}


async def test_strict_mode_is_as_strict_as_a_conformant_provider() -> None:
    """Each point of `MockOAuthProvider.strict()` seen with plain httpx (what a connector must get right)."""
    provider = MockOIDCProvider.strict(narrow_scopes={"repo"})
    assert set("+/=:") <= set(provider.client_secret)
    async with provider.serve_http(), httpx.AsyncClient() as http:
        token = f"{provider.base_url}/token"
        # Basic auth: the RFC 6749 §2.3.1 form-encoding is required; raw credentials ('+' read as ' ') fail.
        raw = (provider.client_id, provider.client_secret)
        refused = await http.post(token, data=_form(await _code(http, provider, "openid")), auth=raw)
        assert refused.status_code == 401 and refused.json()["error"] == "invalid_client"
        encoded = {"Authorization": basic_credentials(provider.client_id, provider.client_secret)}
        # offline_access without prompt=consent is dropped, and so there is no refresh token; scopes are narrowed.
        code = await _code(http, provider, "openid offline_access read:user repo")
        silent = (await http.post(token, data=_form(code), headers=encoded)).json()
        assert silent["scope"] == "openid read:user" and "refresh_token" not in silent
        assert silent["expires_in"] == 30
        code = await _code(http, provider, "openid offline_access", prompt="consent")
        granted = (await http.post(token, data=_form(code), headers=encoded)).json()
        assert granted["scope"] == "openid offline_access" and granted["refresh_token"]
        # A refresh answers with an ID token too; revoking one token of a grant ends all of them.
        provider.refresh_sub_override = "someone-else"
        form = {"grant_type": "refresh_token", "refresh_token": granted["refresh_token"]}
        refreshed = (await http.post(token, data=form, headers=encoded)).json()
        assert refreshed["id_token"] and provider.issued_id_tokens[-1] == refreshed["id_token"]
        assert _claims(refreshed["id_token"])["sub"] == "someone-else"
        revoke = {"token": refreshed["refresh_token"], "client_id": provider.client_id}
        revoke["client_secret"] = provider.client_secret
        assert (await http.post(f"{provider.base_url}/revoke", data=revoke)).status_code == 200
        assert not provider.token_active(refreshed["access_token"])
    assert [r["client_auth"] for r in provider.token_requests] == [
        "failed",
        "client_secret_basic",
        "client_secret_basic",
        "client_secret_basic",
    ]


def _claims(jwt: str) -> dict[str, object]:
    part = jwt.split(".")[1]
    claims: dict[str, object] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return claims


def test_a_port_zero_socket_whose_listen_clashes_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    # With SO_REUSEADDR, Linux may give port 0 a port that a connected socket holds; only listen() finds the clash
    # (seen as a test deployment failing to start with EADDRINUSE). Another port is taken instead.
    from service.web.server import listening_socket

    real_listen = socket.socket.listen
    clashed: list[int] = []

    def listen(sock: socket.socket, *args: int) -> None:
        if not clashed:
            clashed.append(sock.getsockname()[1])
            raise OSError(errno.EADDRINUSE, "Address already in use")
        real_listen(sock, *args)

    monkeypatch.setattr(socket.socket, "listen", listen)
    with listening_socket("127.0.0.1") as sock, socket.create_connection(sock.getsockname()[:2], timeout=5):
        assert len(clashed) == 1  # the clash was met once, and a listening socket came back
    monkeypatch.undo()
    with listening_socket("127.0.0.1") as held, pytest.raises(OSError) as refused:
        listening_socket("127.0.0.1", held.getsockname()[1])  # a port asked for by number is not replaced
    assert refused.value.errno == errno.EADDRINUSE


@asynccontextmanager
async def _mock_process(*args: str) -> AsyncIterator[str]:
    """`acp-connector mock-provider ARGS --port 0` in a process of its own: its base URL while the block runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    env.update(CONNECTOR_PROVIDER_SHOPIFY_CLIENT_ID="dev-id", CONNECTOR_PROVIDER_SHOPIFY_CLIENT_SECRET="dev-secret")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service.cli",
        "mock-provider",
        *args,
        "--port",
        "0",
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        first = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert first.startswith("# mock OAuth provider at "), first
        yield first.removeprefix("# mock OAuth provider at ").split(";")[0]
    finally:
        process.terminate()
        await process.wait()


async def test_the_mock_provider_process_migrates_legacy_tokens_as_shopify_does() -> None:
    """`mock-provider --like shopify --legacy` over HTTP, as Shopify's library calls it: a legacy token from the code
    exchange, its JSON token exchange, the old token dead after it, a retry answered the same pair until that pair is
    refreshed, an unknown token refused."""
    async with _mock_process("--like", "shopify", "--legacy") as base_url, httpx.AsyncClient() as http:
        shop = f"{base_url}/acme.myshopify.com/admin"
        client = {"client_id": "dev-id", "client_secret": "dev-secret"}
        query = {"client_id": "dev-id", "redirect_uri": REDIRECT, "response_type": "code", "scope": "read_products"}
        authorized = await http.get(f"{shop}/oauth/authorize", params={**query, "state": "s"})
        code = parse_qs(urlsplit(authorized.headers["location"]).query)["code"][0]
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "expiring": "1", **client}
        legacy = (await http.post(f"{shop}/oauth/access_token", data=form)).json()
        assert set(legacy) == {"access_token", "scope", "token_type"}  # no expiry, no refresh token
        old = legacy["access_token"]

        async def api(token: str) -> int:
            return (
                await http.get(f"{shop}/api/2025-01/products.json", headers={"X-Shopify-Access-Token": token})
            ).status_code

        async def exchange(subject: str, **changed: str) -> httpx.Response:
            body = {
                **client,
                "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                "subject_token": subject,
                "subject_token_type": "urn:shopify:params:oauth:token-type:offline-access-token",
                "requested_token_type": "urn:shopify:params:oauth:token-type:offline-access-token",
                "expiring": "1",
                **changed,
            }
            return await http.post(f"{shop}/oauth/access_token", json=body, headers={"Accept": "application/json"})

        assert await api(old) == 200
        assert (await http.post(f"{shop}/oauth/access_token", data={**client, "subject_token": old})).status_code == 400
        assert (await exchange(old, expiring="0")).status_code == 400  # as Shopify's migration asks, or refused
        migrated = await exchange(old)
        assert migrated.status_code == 200, migrated.text
        pair = migrated.json()
        assert pair["expires_in"] == 3600 and pair["refresh_token"] and pair["refresh_token_expires_in"]
        assert await api(old) == 401 and await api(pair["access_token"]) == 200
        again = await exchange(old)  # the answer was lost: a retry with the original token gets the same pair
        assert (again.json()["access_token"], again.json()["refresh_token"]) == (
            pair["access_token"],
            pair["refresh_token"],
        )
        refresh = {"grant_type": "refresh_token", "refresh_token": pair["refresh_token"], **client}
        assert (await http.post(f"{shop}/oauth/access_token", data=refresh)).status_code == 200
        for subject in (old, "shpat_unknown"):  # the pair was refreshed: recovery is over; an unknown token
            refused = await exchange(subject)
            assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant"
