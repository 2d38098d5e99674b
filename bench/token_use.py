"""How much the connector adds to a provider API call: grant lookup, decryption and token injection.

Runs three loops against the same in-memory API (httpx.MockTransport, no network) and prints each one's rate and
its ratio to the baseline, side by side:
  baseline     a plain httpx client with a static bearer header
  connector    one `connector.http(user, provider)` client reused for every call (decrypt per request)
  per-call     a new `connector.http(...)` per call (adds the grant lookup in the database)

    .venv/bin/python bench/token_use.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

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


async def timed(label: str, calls: int, body) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    await body()
    elapsed = time.perf_counter() - start
    return calls / elapsed


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        provider = MockOAuthProvider()
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
        os.environ.update(env)
        config = Path(tmp) / "connector.toml"
        config.write_text("")
        settings = load_settings(config, env=env)
        migrate(settings.database.url)
        connector = Connector.from_settings(settings)
        await connector.start()
        token = "bench_at_" + secrets.token_urlsafe(24)
        now = datetime.now(UTC)
        tokens = TokenSet(token, "bearer", None, None, ("read:user",))
        key_id, blob = connector.runtime.vault.encrypt_json(
            tokens.to_json(), aad=grant_aad(USER.issuer, USER.subject, "github", "1")
        )
        await connector.runtime.store.grants.upsert(
            GrantRecord(secrets.token_urlsafe(16), USER, "github", "1", ("read:user",), key_id, blob, None, now, now)
        )
        transport = httpx.MockTransport(api)
        base = entry["api_base_url"]

        async def baseline() -> None:
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=base, transport=transport, headers=headers) as client:
                for _ in range(calls):
                    await client.get("user")

        async def reused() -> None:
            async with connector.http(USER, "github", transport=transport) as client:
                for _ in range(calls):
                    await client.get("user")

        async def per_call() -> None:
            for _ in range(calls):
                async with connector.http(USER, "github", transport=transport) as client:
                    await client.get("user")

        results = []
        for label, body in (("baseline", baseline), ("connector", reused), ("per-call", per_call)):
            await body()  # warm-up
            results.append((label, await timed(label, calls, body)))
        await connector.close()
    base_rate = results[0][1]
    print(f"{'loop':<10} {'calls/s':>10} {'vs baseline':>12}")
    for label, rate in results:
        print(f"{label:<10} {rate:>10.0f} {rate / base_rate:>11.2f}x")


def _toml(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value) + '"'


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    asyncio.run(main(parser.parse_args().calls))
