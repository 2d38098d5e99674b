"""What the connector adds to a provider API call, and what a connect flow spends creating HTTP clients.

Everything runs over real loopback sockets: the mock provider (`MockOAuthProvider.serve_http`, uvicorn, TCP_NODELAY)
serves the authorization, token and userinfo endpoints and a small API that checks the bearer token; the
connector's own web routes are served by uvicorn too, and a scripted browser walks the connect flow.

Token use, side by side in interleaved rounds (the median round of each is reported):
  direct      a plain long-lived `httpx.AsyncClient` with a static bearer header (keep-alive): the baseline
  long-lived  one `connector.http(user, provider)` context reused for every call (goal >= 0.9x)
  per-call    a new `connector.http(user, provider)` context for every call, as the README and examples do
              (goal >= 0.7x: the provider's pooled connection and the cached grant lookup make it cheap)
  reconnect   the direct client without keep-alive, a new TCP connection per call: must stay slower than
              `direct`, else the server stalls keep-alive answers (no TCP_NODELAY: Nagle meets delayed ACK)
No call needs a refresh (the mock's tokens live an hour).

Connect flows: the time spent inside `httpx.AsyncClient(...)` constructors per flow, and, for comparison, what
creating one such client costs (each token, userinfo and API use paid that before clients were pooled).

    .venv/bin/python bench/token_use.py [--calls 2000] [--rounds 5] [--flows 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from service import Connector, Identity, RequestScope, load_settings
from service.store import migrate
from service.testing import MockOAuthProvider, ScriptedBrowser
from service.vault import generate_key
from service.web.server import listening_socket, serving


class ClientCreation:
    """Counts `httpx.AsyncClient` constructions and the time spent in them, while installed."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._original = httpx.AsyncClient.__init__

    def __enter__(self) -> ClientCreation:
        original = self._original
        meter = self

        def timed_init(client: httpx.AsyncClient, *args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            try:
                original(client, *args, **kwargs)
            finally:
                meter.seconds += time.perf_counter() - start
                meter.count += 1

        httpx.AsyncClient.__init__ = timed_init  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        httpx.AsyncClient.__init__ = self._original  # type: ignore[method-assign]


@asynccontextmanager
async def deployment(tmp: Path, provider: MockOAuthProvider, **settings_env: str) -> AsyncIterator[Connector]:
    """A migrated connector whose catalog names the served mock provider, its web routes on a loopback port
    (`settings_env`: more CONNECTOR_* settings)."""
    entry = provider.catalog_entry()
    catalog = tmp / "providers.toml"
    catalog.write_text("[github]\n" + "\n".join(f"{k} = {_toml(v)}" for k, v in entry.items()) + "\n")
    with listening_socket("127.0.0.1") as sock:
        env = {
            "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{sock.getsockname()[1]}",
            "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp}/bench.db",
            "CONNECTOR_VAULT__KEYS": generate_key("k1"),
            "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": provider.client_id,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": provider.client_secret,
            "CONNECTOR_IDENTITY__LOCAL__ISSUER": "https://login.example.com",
            "CONNECTOR_IDENTITY__LOCAL__SUBJECT": "bench-user",
            **settings_env,
        }
        config = tmp / "connector.toml"
        config.write_text("")
        settings = load_settings(config, env=env)
        migrate(settings.database.url)
        connector = Connector.from_settings(settings)
        await connector.start()
        try:
            async with serving(connector.asgi_app(), sock):
                yield connector
        finally:
            await connector.close()


async def connect_flows(connector: Connector, user: Identity, flows: int) -> tuple[float, int, float]:
    """Run `flows` connect flows in the browser; (seconds in client constructors per flow, clients per flow,
    seconds per flow)."""
    async with ScriptedBrowser() as browser:
        with ClientCreation() as meter:
            start = time.perf_counter()
            for n in range(flows):
                record = await connector.runtime.elicitations.create(
                    connection_key="bench",
                    user=user,
                    provider="github",
                    scopes=("read:user",),
                    scope=RequestScope(f"bench-{n}"),
                )
                page = await browser.authorize(connector.runtime.elicitations.connect_url(record.id))
                assert page.status_code == 200, page.text
            elapsed = time.perf_counter() - start
    return meter.seconds / flows, meter.count / flows, elapsed / flows


async def rate(calls: int, body: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await body()
    return calls / (time.perf_counter() - start)


async def main(calls: int, rounds: int, flows: int) -> None:
    provider = MockOAuthProvider()
    async with provider.serve_http(), deployment_in_tmp(provider) as connector:
        user = connector.verifier.user()  # type: ignore[attr-defined]
        await connect_flows(connector, user, 1)  # warm-up: the provider's pool is opened here
        per_flow_creation, clients_per_flow, per_flow = await connect_flows(connector, user, flows)
        with ClientCreation() as one:
            for _ in range(20):
                httpx.AsyncClient()
        new_client_cost = one.seconds / one.count

        token = provider.issued_access_tokens[-1]
        api = f"{provider.base_url}/api/"

        async def direct() -> None:
            async with httpx.AsyncClient(base_url=api, headers={"Authorization": f"Bearer {token}"}) as client:
                for _ in range(calls):
                    (await client.get("user")).raise_for_status()

        async def long_lived() -> None:
            async with connector.http(user, "github") as client:
                for _ in range(calls):
                    (await client.get("user")).raise_for_status()

        async def per_call() -> None:
            for _ in range(calls):
                async with connector.http(user, "github") as client:
                    (await client.get("user")).raise_for_status()

        async def reconnect() -> None:
            no_keepalive = httpx.Limits(max_keepalive_connections=0)
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=api, headers=headers, limits=no_keepalive) as client:
                for _ in range(calls):
                    (await client.get("user")).raise_for_status()

        loops = {"direct": direct, "long-lived": long_lived, "per-call": per_call, "reconnect": reconnect}
        for body in loops.values():
            await rate(calls // 10 or 1, body)  # warm-up (connections, caches)
        measured: dict[str, list[float]] = {label: [] for label in loops}
        for _ in range(rounds):
            for label, body in loops.items():
                measured[label].append(await rate(calls, body))
        refreshes = sum(1 for r in provider.token_requests if r.get("grant_type") == "refresh_token")

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )
    print(f"## token use over loopback: {calls} calls per round, {rounds} rounds (median round)")
    print(f"{'loop':<12} {'calls/s':>9} {'vs direct':>10}")
    base = statistics.median(measured["direct"])
    for label, rates in measured.items():
        median = statistics.median(rates)
        print(f"{label:<12} {median:>9.0f} {median / base:>9.2f}x")
    print(f"refreshes during token use: {refreshes}")
    print(f"## connect flow ({flows} flows, browser + connector + provider over loopback)")
    print(f"time per flow:                          {per_flow * 1000:8.1f} ms")
    created = f"{per_flow_creation * 1000:8.3f} ms ({clients_per_flow:.1f} clients)"
    print(f"in httpx client constructors, per flow: {created}")
    print(f"one new httpx.AsyncClient (what each provider call paid before pooling): {new_client_cost * 1000:.1f} ms")


@asynccontextmanager
async def deployment_in_tmp(provider: MockOAuthProvider, **settings_env: str) -> AsyncIterator[Connector]:
    with tempfile.TemporaryDirectory() as tmp:
        async with deployment(Path(tmp), provider, **settings_env) as deployed:
            yield deployed


def _toml(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value) + '"'


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--flows", type=int, default=20)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.calls, arguments.rounds, arguments.flows))
