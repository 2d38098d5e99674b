"""How much the connector adds to a provider API call: grant lookup, decryption and token injection.

Runs the loops below against the mock provider's API, first in memory (httpx.MockTransport, no network), then
served by uvicorn on loopback (`MockOAuthProvider.serve_http()`, real sockets), and prints each loop's rate and
its ratio to that transport's baseline:
  baseline     a plain httpx client with a static bearer header, reusing its connection
  reconnect    (loopback only) the baseline client without keep-alive: a new TCP connection per call
  connector    one `connector.http(user, provider)` client reused for every call (decrypt per request)
  per-call     a new `connector.http(...)` per call (adds the grant lookup in the database)

On loopback, `reconnect` must stay slower than `baseline`: if reusing a connection is slower than opening a new
one, the server is stalling keep-alive responses (no TCP_NODELAY; Nagle meets delayed ACK).

    .venv/bin/python bench/token_use.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from service import Connector, Identity, load_settings
from service.core.handles import grant_aad
from service.core.records import GrantRecord, TokenSet
from service.store import migrate
from service.testing import MockOAuthProvider
from service.vault import generate_key

USER = Identity("https://login.example.com", "bench-user")


def api(request: httpx.Request) -> httpx.Response:
    assert request.headers["authorization"].startswith("Bearer ")
    return httpx.Response(200, json={"id": 1})


async def timed(calls: int, body: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await body()
    elapsed = time.perf_counter() - start
    return calls / elapsed


async def provider_token(provider: MockOAuthProvider) -> str:
    """An access token the served provider really issued (code flow with PKCE over HTTP)."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    redirect = "http://127.0.0.1:9/callback/github"
    async with httpx.AsyncClient(base_url=provider.base_url) as http:
        authorized = await http.get(
            "/authorize",
            params={
                "client_id": provider.client_id,
                "redirect_uri": redirect,
                "response_type": "code",
                "scope": "read:user",
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            },
        )
        code = parse_qs(urlsplit(authorized.headers["location"]).query)["code"][0]
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect, "code_verifier": verifier}
        answer = await http.post("/token", data=form, auth=(provider.client_id, provider.client_secret))
        return str(answer.json()["access_token"])


async def measure(
    provider: MockOAuthProvider, token: str, calls: int, transport: httpx.AsyncBaseTransport | None
) -> list[tuple[str, float]]:
    """The loops against `provider` (its API in memory through `transport`, or over its socket when None)."""
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Path(tmp) / "providers.toml"
        entry = provider.catalog_entry()
        catalog.write_text("[github]\n" + "\n".join(f"{k} = {_toml(v)}" for k, v in entry.items()) + "\n")
        env = {
            "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp}/bench.db",
            "CONNECTOR_VAULT__KEYS": generate_key("k1"),
            "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": provider.client_id,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": provider.client_secret,
        }
        config = Path(tmp) / "connector.toml"
        config.write_text("")
        settings = load_settings(config, env=env)
        migrate(settings.database.url)
        connector = Connector.from_settings(settings)
        await connector.start()
        now = datetime.now(UTC)
        tokens = TokenSet(token, "bearer", None, None, ("read:user",))
        key_id, blob = connector.runtime.vault.encrypt_json(
            tokens.to_json(), aad=grant_aad(USER.issuer, USER.subject, "github", "1")
        )
        await connector.runtime.store.grants.upsert(
            GrantRecord(secrets.token_urlsafe(16), USER, "github", "1", ("read:user",), key_id, blob, None, now, now)
        )
        base = entry["api_base_url"]
        headers = {"Authorization": f"Bearer {token}"}
        options: dict[str, Any] = {} if transport is None else {"transport": transport}

        async def baseline() -> None:
            async with httpx.AsyncClient(base_url=base, headers=headers, **options) as client:
                for _ in range(calls):
                    (await client.get("user")).raise_for_status()

        async def reconnect() -> None:
            no_keepalive = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=base, headers=headers, limits=no_keepalive) as client:
                for _ in range(calls):
                    (await client.get("user")).raise_for_status()

        async def reused() -> None:
            async with connector.http(USER, "github", **options) as client:
                for _ in range(calls):
                    (await client.get("user")).raise_for_status()

        async def per_call() -> None:
            for _ in range(calls):
                async with connector.http(USER, "github", **options) as client:
                    (await client.get("user")).raise_for_status()

        loops = [("baseline", baseline), ("connector", reused), ("per-call", per_call)]
        if transport is None:
            loops.insert(1, ("reconnect", reconnect))
        results = []
        try:
            for label, body in loops:
                await body()  # warm-up
                results.append((label, await timed(calls, body)))
        finally:
            await connector.close()
        return results


async def main(calls: int) -> None:
    in_memory = MockOAuthProvider()
    runs = [("in memory", await measure(in_memory, "bench_at_static", calls, httpx.MockTransport(api)))]
    served = MockOAuthProvider()
    async with served.serve_http():
        runs.append(("loopback", await measure(served, await provider_token(served), calls, None)))
    print(f"{'transport':<10} {'loop':<10} {'calls/s':>10} {'vs baseline':>12}")
    for name, results in runs:
        base_rate = results[0][1]
        for label, rate in results:
            print(f"{name:<10} {label:<10} {rate:>10.0f} {rate / base_rate:>11.2f}x")


def _toml(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value) + '"'


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    asyncio.run(main(parser.parse_args().calls))
