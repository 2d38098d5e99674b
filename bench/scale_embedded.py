"""Token use through the embedded `connector.http()` at scale: one user's call to the bench API through a connector
on the loaded database against one on the empty database (`bench/scale.py` runs it beside the sidecars' figures).

Both connectors live in this process, configured as the sidecars are (the same key ring, catalog and client), with
their background work off; the embedded connector's tenant (`embedded`) shares grants with the sidecars' API key
tenant (`bench`), whose grant the bench seeded. Each call opens a new `connector.http(user, "bench")` context, as
the README's examples do, and GETs the small answer; routes interleaved in blocks of 50, sequential.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from bench.harness import percentile
from service import Connector, Identity, load_settings

BLOCK = 50
GOAL = 1.2  # p99 loaded / empty


@contextlib.asynccontextmanager
async def embedded(database_url: str, vault_key: str, catalog: Path) -> AsyncIterator[Connector]:
    env = {
        "CONNECTOR_DATABASE__URL": database_url,
        "CONNECTOR_VAULT__KEYS": vault_key,
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_PROVIDER_BENCH_CLIENT_ID": "bench",
        "CONNECTOR_PROVIDER_BENCH_CLIENT_SECRET": "bench-secret",
        "CONNECTOR_TENANTS__SHARED_GROUPS": "embedded+bench",
        **{f"CONNECTOR_RETENTION__{kind}_DAYS": "0" for kind in ("ELICITATION", "VERIFICATION", "AUDIT")},
        **{f"CONNECTOR_RETENTION__{kind}_DAYS": "0" for kind in ("EVENT", "WEBHOOK_DELIVERY")},
    }
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "connector.toml"
        config.write_text("")
        connector = Connector.from_settings(load_settings(config, env=env))
        await connector.start()
        try:
            yield connector
        finally:
            await connector.close()


async def embedded_token_use(
    urls: dict[str, str], vault_key: str, catalog: Path, user: Identity, calls: int
) -> tuple[list[str], bool]:
    """p50/p99 of `connector.http()` calls on each database (name -> URL); the goal is p99 loaded / empty <= 1.2x."""
    async with contextlib.AsyncExitStack() as stack:
        connectors = {
            name: await stack.enter_async_context(embedded(url, vault_key, catalog)) for name, url in urls.items()
        }

        async def call(connector: Connector) -> float:
            started = time.perf_counter()
            async with connector.http(user, "bench") as api:
                (await api.get("small")).raise_for_status()
            return (time.perf_counter() - started) * 1000

        for connector in connectors.values():  # warm-up: connections, the grant's lookup
            for _ in range(BLOCK):
                await call(connector)
        samples: dict[str, list[float]] = {name: [] for name in connectors}
        for _ in range(0, calls, BLOCK):
            for name, connector in connectors.items():
                samples[name] += [await call(connector) for _ in range(BLOCK)]
    p = {name: (percentile(s, 50), percentile(s, 99)) for name, s in samples.items()}
    ratio = p["loaded"][1] / p["empty"][1]
    lines = [
        f"The embedded `connector.http()` (a new context a call), {calls} calls per database, interleaved (ms):",
        "",
        "| database | p50 | p99 |",
        "|---|---:|---:|",
        *(f"| {name} | {p50:.2f} | {p99:.2f} |" for name, (p50, p99) in p.items()),
        "",
        f"- embedded call p99, loaded / empty: {ratio:.2f}x (goal <= {GOAL}x): {'met' if ratio <= GOAL else 'NOT met'}"
        " (the grant's lookup and its decrypted tokens are kept in memory until the grant changes: after the first"
        " call no call reads the database)",
    ]
    return lines, ratio <= GOAL
