"""What a DPoP-bound grant (RFC 9449) costs per proxied call, beside a Bearer grant, through /v1/proxy.

Three processes on loopback: a provider API (uvicorn, this file with --upstream) that accepts the Bearer token on
`/plain/...` and, on `/bound/...`, only the DPoP-bound token with a valid proof (signature by the key the token is
bound to, `htm`, `htu`, `iat` within a minute, `ath` the token's hash, a `jti` not seen before), the sidecar
(`acp-connector serve`, two catalog entries on that API: `plain` and `bound` with `dpop = true`, each with a grant
seeded as the sidecar would store it) and the measuring client (this process, httpx with keep-alive).

Sequential small GETs, interleaved in blocks: direct (Bearer, no proxy), proxied Bearer, proxied DPoP; p50 / p99,
the DPoP route's added p50 over the Bearer one, and CPU per call of each process (the sidecar signs one ES256 proof
per call; the API verifies it).

    .venv/bin/python -m bench.dpop [--quick] [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.harness import connector_env, free_port, machine, percentile, wait_until_up
from bench.proxy import BLOCK, latencies

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-access-token"  # noqa: S105 - what the fake provider accepts as a Bearer token
BOUND_TOKEN = "bench-dpop-bound-token"  # noqa: S105 - accepted only with a proof by the bound key
USER = ("https://login.example.com", "bench-user")


def upstream_app(thumbprint: str):  # type: ignore[no-untyped-def]
    from joserfc import jwt
    from joserfc.errors import JoseError
    from joserfc.jwk import ECKey
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    seen: set[str] = set()
    answer = {"id": 1, "login": "octocat", "name": "Mona Lisa Octocat"}

    def proof_ok(request: Request) -> bool:
        """RFC 9449 §4.3 and §7.1, as a resource server checks them."""
        if request.headers.get("authorization") != f"DPoP {BOUND_TOKEN}":
            return False
        proof = request.headers.get("dpop", "")
        try:
            head = proof.split(".", 1)[0]
            jwk = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))["jwk"]
            key = ECKey.import_key(jwk)
            token = jwt.decode(proof, key, algorithms=["ES256"])
        except (JoseError, ValueError, KeyError):
            return False
        claims = token.claims
        ath = base64.urlsafe_b64encode(hashlib.sha256(BOUND_TOKEN.encode()).digest()).rstrip(b"=").decode()
        url = str(request.url.replace(query=""))
        fresh = abs(time.time() - float(claims.get("iat", 0))) < 60
        if key.thumbprint() != thumbprint or token.header.get("typ") != "dpop+jwt" or not fresh:
            return False
        if claims.get("htm") != request.method or claims.get("htu") != url.rstrip("?") or claims.get("ath") != ath:
            return False
        if claims.get("jti") in seen:
            return False
        seen.add(str(claims.get("jti")))
        return True

    async def plain(request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"message": "Bad credentials"}, 401)
        return JSONResponse(answer)

    async def bound(request: Request) -> Response:
        if not proof_ok(request):
            return JSONResponse(
                {"error": "invalid_token"}, 401, headers={"WWW-Authenticate": 'DPoP error="invalid_token"'}
            )
        return JSONResponse(answer)

    return Starlette(routes=[Route("/plain/small", plain), Route("/bound/small", bound)])


async def seed(db_url: str, vault_key: str, dpop_jwk: dict[str, str]) -> str:
    """An API key, and the bench user's grants at `plain` (Bearer) and `bound` (DPoP), as the sidecar stores them."""
    from service import Identity
    from service.core.agent_api import new_api_key
    from service.core.handles import grant_aad, new_id
    from service.core.records import GrantRecord, TokenSet
    from service.store import Store, migrate
    from service.vault import Vault, load_key_ring

    migrate(db_url)
    store = Store.from_url(db_url)
    try:
        now = datetime.now(UTC)
        key, record = new_api_key("bench", "Bench", None, now)
        await store.api_keys.insert(record)
        user = Identity(*USER)
        ring = load_key_ring([vault_key], None, None)
        assert ring is not None
        grants = {
            "plain": TokenSet(TOKEN, "Bearer", None, None, ("read",)),
            "bound": TokenSet(BOUND_TOKEN, "DPoP", None, None, ("read",), dpop_key=dpop_jwk),
        }
        for provider, tokens in grants.items():
            aad = grant_aad(user.issuer, user.subject, provider, "1")
            key_id, blob = Vault(ring).encrypt_json(tokens.to_json(), aad=aad)
            grant = GrantRecord(
                new_id(16), user, provider, "1", ("read",), key_id, blob, None, now, now, tenant=record.tenant
            )
            await store.grants.upsert(grant)
        return key
    finally:
        await store.close()


async def main(calls: int) -> None:
    from service.oauth.dpop import DpopKey
    from service.vault import generate_key

    key = DpopKey.generate()
    with tempfile.TemporaryDirectory() as tmp:
        up_port, port = free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        catalog = Path(tmp) / "providers.toml"
        catalog.write_text(
            "".join(
                f'[{name}]\nauthorization_endpoint = "{upstream}/authorize"\ntoken_endpoint = "{upstream}/token"\n'
                f'api_base_url = "{upstream}/{name}"\n' + ("dpop = true\n" if name == "bound" else "")
                for name in ("plain", "bound")
            )
        )
        vault_key = generate_key("k1")
        db_url = f"sqlite+aiosqlite:///{tmp}/bench.db"
        api_key = await seed(db_url, vault_key, key.private_jwk())
        log = open(Path(tmp) / "processes.log", "wb")  # noqa: ASYNC230 - closed below
        env = {
            **connector_env(port, db_url, vault_key, catalog),
            "CONNECTOR_LOG_FORMAT": "json",
            **{f"CONNECTOR_PROVIDER_{n}_CLIENT_{s}": "bench" for n in ("PLAIN", "BOUND") for s in ("ID", "SECRET")},
        }
        processes = {
            "upstream": await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.dpop", "--upstream", str(up_port), "--jkt", key.thumbprint,
                cwd=ROOT, stdout=log, stderr=log,
            ),
            "sidecar": await asyncio.create_subprocess_exec(
                sys.executable, "-m", "service.cli", "serve", env=env, cwd=ROOT, stdout=log, stderr=log
            ),
        }  # fmt: skip
        try:
            await wait_until_up(f"{upstream}/plain/small", within=60)
            await wait_until_up(f"http://127.0.0.1:{port}/healthz", within=60)
            proxy_headers = {
                "Authorization": f"Bearer {api_key}",
                "Connector-User-Issuer": USER[0],
                "Connector-User-Subject": USER[1],
            }
            routes = {
                "direct": (f"{upstream}/plain/small", {"Authorization": f"Bearer {TOKEN}"}),
                "bearer": (f"http://127.0.0.1:{port}/v1/proxy/plain/small", proxy_headers),
                "dpop": (f"http://127.0.0.1:{port}/v1/proxy/bound/small", proxy_headers),
            }
            pids = {"client": os.getpid(), **{name: process.pid for name, process in processes.items()}}
            async with httpx.AsyncClient(timeout=120) as client:
                measured = await latencies(client, routes, calls, pids)
        finally:
            for process in processes.values():
                process.terminate()
                await process.wait()
            log.close()

    print(f"Measured on {machine()}.")
    print(f"latency, {calls} sequential small GETs per route, interleaved in blocks of {BLOCK} (ms): p50 / p99")
    for name, (samples, _) in measured.items():
        print(f"  {name:7s} {statistics.median(samples):7.2f} / {percentile(samples, 99):7.2f}")
    added = statistics.median(measured["dpop"][0]) - statistics.median(measured["bearer"][0])
    print(f"  DPoP added p50 over the proxied Bearer call: {added:.2f} ms")
    print("CPU per small GET (ms, /proc/<pid>/stat): the sidecar signs a proof per DPoP call, the API verifies it")
    for name, (_, cpu) in measured.items():
        print(f"  {name:7s} " + ", ".join(f"{process} {ms:.2f}" for process, ms in cpu.items()))


def serve_upstream(port: int, thumbprint: str) -> None:
    import uvicorn

    uvicorn.run(
        upstream_app(thumbprint),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        http="h11",
        loop="asyncio",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--jkt", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.upstream:
        serve_upstream(options.upstream, options.jkt)
    else:
        asyncio.run(main(options.calls or (200 if options.quick else 1000)))
