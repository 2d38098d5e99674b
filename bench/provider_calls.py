"""The callback's two provider calls (code exchange, userinfo) from the connector's gateway against authlib's client.

One process: the connector's `ProviderGateway.redeem` (its pooled httpx client) and the baseline app's way, a
long-lived authlib `AsyncOAuth2Client` (`fetch_token`, then the userinfo GET), in alternating batches against the
benchmark's mock provider in a process of its own (bench/mock.py). Reported: CPU of the event loop's thread per
redeem (token + userinfo), each way, and the ratio. Each redeem needs a fresh code: the provider's authorize is asked
for one between the timed calls.

A third way is an experiment, not the connector's code: a second gateway whose provider pool has a network backend on
asyncio's streams (plain TCP only, enough for the loopback mock) instead of httpcore's anyio backend, to measure what
anyio's cancel scopes and checkpoints cost a call.

    .venv/bin/python -m bench.provider_calls [--batches 12] [--per-batch 60]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import secrets
import socket
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpcore
import httpx
from httpcore._utils import is_socket_readable

from bench.driver import provider_catalog
from bench.harness import children, free_port, machine, median, wait_until_up
from service import load_settings
from service.app import build_runtime
from service.vault import generate_key

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # authlib 1.9 nudges towards the httpx2 fork
    from authlib.integrations.httpx_client import AsyncOAuth2Client

CLIENT_ID, CLIENT_SECRET = "bench-client", "bench-secret-" + secrets.token_hex(8)
REDIRECT_URI = "http://127.0.0.1:1/callback/github"


class _AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 - httpcore's
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.ReadError(exc) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 - httpcore's
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.WriteError(exc) from exc

    async def aclose(self) -> None:
        self._writer.close()

    def get_extra_info(self, info: str) -> Any:
        sock = self._writer.get_extra_info("socket")
        if info == "is_readable":
            return is_socket_readable(sock)
        return sock if info == "socket" else None


class _AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def main(batches: int, per_batch: int) -> list[str]:
    port = free_port()
    provider_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Path(tmp) / "providers.toml"
        catalog.write_text(provider_catalog(provider_url))
        os.environ.update(
            {
                "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp}/bench.db",
                "CONNECTOR_VAULT__KEYS": generate_key("bench"),
                "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
                "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": CLIENT_ID,
                "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": CLIENT_SECRET,
            }
        )
        async with children() as group:
            group.start("-m", "bench.mock", str(port), CLIENT_ID, CLIENT_SECRET)
            await wait_until_up(f"{provider_url}/api/user")
            gateway = build_runtime(load_settings(None)).providers
            provider = await gateway.resolve("github")
            experiment = build_runtime(load_settings(None)).providers
            experiment.http_client(provider)
            experiment.http._pools["github"]._pool._network_backend = _AsyncioBackend()  # type: ignore[attr-defined]
            authlib = AsyncOAuth2Client(CLIENT_ID, CLIENT_SECRET, code_challenge_method="S256")
            async with httpx.AsyncClient() as browser:

                async def new_code() -> tuple[str, str]:
                    verifier = secrets.token_urlsafe(43)
                    digest = hashlib.sha256(verifier.encode()).digest()
                    challenge = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
                    answer = await browser.get(
                        f"{provider_url}/authorize",
                        params={
                            "response_type": "code",
                            "client_id": CLIENT_ID,
                            "redirect_uri": REDIRECT_URI,
                            "state": "s",
                            "code_challenge": challenge,
                            "code_challenge_method": "S256",
                            "scope": "read:user",
                        },
                    )
                    return parse_qs(urlparse(answer.headers["location"]).query)["code"][0], verifier

                async def connector(code: str, verifier: str, through: Any = gateway) -> None:
                    await through.redeem(
                        provider,
                        redirect_uri=REDIRECT_URI,
                        code=code,
                        code_verifier=verifier,
                        expected_issuer=None,
                        nonce=None,
                        now=datetime.now(UTC),
                    )

                async def connector_on_asyncio(code: str, verifier: str) -> None:
                    await connector(code, verifier, experiment)

                async def baseline(code: str, verifier: str) -> None:
                    token = await authlib.fetch_token(
                        f"{provider_url}/token", code=code, redirect_uri=REDIRECT_URI, code_verifier=verifier
                    )
                    answer = await authlib.request(
                        "GET",
                        f"{provider_url}/api/user",
                        headers={"Authorization": f"Bearer {token['access_token']}"},
                        withhold_token=True,
                    )
                    answer.json()

                ways: dict[str, Callable[[str, str], Awaitable[None]]] = {
                    "connector": connector,
                    "experiment": connector_on_asyncio,
                    "authlib": baseline,
                }
                spent: dict[str, list[float]] = {name: [] for name in ways}
                for batch in range(batches + 2):  # the first two warm up
                    order = list(ways.items()) if batch % 2 == 0 else list(reversed(ways.items()))
                    for name, way in order:
                        total = 0.0
                        for _ in range(per_batch):
                            code, verifier = await new_code()
                            started = time.thread_time()
                            await way(code, verifier)
                            total += time.thread_time() - started
                        if batch >= 2:
                            spent[name].append(total / per_batch * 1e6)
            await gateway.http.aclose()
            await experiment.http.aclose()
            await authlib.aclose()
    ours, tried, theirs = median(spent["connector"]), median(spent["experiment"]), median(spent["authlib"])
    return [
        f"Measured on: {machine()}",
        "",
        f"| token + userinfo, CPU of the event loop's thread per redeem ({batches} alternating batches of "
        f"{per_batch}, medians) | us | |",
        "|---|---|---|",
        f"| the connector's gateway, its pool on httpcore's anyio backend (as shipped) | {ours:.0f} "
        f"| **{ours / theirs:.2f}x** |",
        f"| the same, the pool on asyncio's streams (the experiment) | {tried:.0f} | **{tried / theirs:.2f}x** "
        f"({tried / ours:.2f}x the shipped one) |",
        f"| authlib's AsyncOAuth2Client (the baseline app's client) | {theirs:.0f} | |",
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--per-batch", type=int, default=60)
    args = parser.parse_args()
    print("\n".join(asyncio.run(main(args.batches, args.per_batch))))
