"""What the sidecar's token proxy (/v1/proxy/<provider>/<path>) costs against calling the provider's API directly.

Three processes on loopback: a provider API (uvicorn, this file with --upstream), the sidecar (`acp-connector serve`)
and the measuring client (this process, httpx with keep-alive). Side by side in one run:
  latency     sequential small GETs (a 60-byte JSON answer): p50 and p99, direct and through the proxy, interleaved
              in blocks; the goal (issue 32) is an added p50 under 1 ms
  CPU         of each process per small GET meanwhile (`/proc/<pid>/stat`); the goal is <= 0.6 ms of the sidecar's
  throughput  large downloads (default 3 x 200 MiB): MiB/s direct and through the proxy; the goal is >= 0.5x

Its report is a table of the goals, met or not, then the figures (`make bench` runs it: `python -m bench.proxy`).

`--compare-with CHECKOUT` adds the sidecar of another checkout of this repository (say, a worktree of main) as a
third route, interleaved with the other two: a before/after comparison in one run, on one machine state.

`--servers LIST` adds this checkout's sidecar under other HTTP servers, each a route of its own beside the stock
one (`acp-connector serve`: uvicorn with h11 on asyncio), interleaved: `uvloop` (h11 on uvloop's event loop),
`httptools` (uvicorn with httptools as the parser), `httptools-uvloop` (both), `granian` (granian's Rust HTTP
server, embedded in the sidecar's asyncio loop: `granian.server.embed`). None of them is a dependency: install them
into the venv to measure (`pip install httptools uvloop granian`). Each runs the same app and runtime as `serve`
builds (`--serve-sidecar`), with the same access line.
`bare` and `bare-granian` are the floor of a proxy in Python on this stack instead: an ASGI function that sends
each request on to the API with the token set, over the same httpx pool, and relays the answer (no API key, no
grant, no routing, no middleware, no log line), under uvicorn with h11 and under granian. `nginx` is a compiled
reverse proxy's data path for scale (nginx on PATH, e.g. Debian's nginx-light; the token in its configuration).

The sidecar logs in JSON, as the Dockerfile and docker-compose.yml configure it (`--log-format text` for the text
lines `make run` writes; each request writes an access-log line either way).

    .venv/bin/python bench/proxy.py [--quick] [--calls 1000] [--mib 200] [--rounds 3] [--log-format json|text]
        [--compare-with CHECKOUT] [--servers httptools,httptools-uvloop,granian] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.harness import connector_env, cpu_ms, free_port, percentile, wait_until_up

ROOT = Path(__file__).resolve().parent.parent
CHUNK = b"\x00" * (1 << 20)
BLOCK = 50  # calls per route before switching to the other one
CPU_GOAL_MS = 0.6  # issue 32: sidecar CPU per small proxied call
ADDED_P50_GOAL_MS = 1.0  # and the latency it adds, p50, on an idle machine
TOKEN = "bench-access-token"  # noqa: S105 - what the fake provider accepts
# --servers: the sidecar under other HTTP servers, and the floor of a proxy in Python on each server (`bare_proxy`)
SERVERS = ("uvloop", "httptools", "httptools-uvloop", "granian", "bare", "bare-granian", "nginx")


def server_missing(server: str) -> str | None:
    """What `server` needs that this machine lacks (a module in this interpreter, a program on PATH), or None."""
    if server == "nginx":
        return None if shutil.which("nginx") else "nginx on PATH (e.g. Debian's nginx-light)"
    needs = [m for m in ("uvloop", "httptools", "granian") if m in server]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    return f"pip install {' '.join(missing)} (into {sys.prefix})" if missing else None


# `acp-connector serve` under cProfile on a CPU clock (the event loop's thread: waiting for the network is not
# charged to whatever awaited it); the stats go to argv[1] when the server stops (SIGINT).
PROFILED_SERVE = """
import cProfile, sys, time
from service.cli.program import main
to = sys.argv.pop(1)
profiler = cProfile.Profile(time.thread_time)
try:
    profiler.runcall(main)
finally:
    profiler.dump_stats(to)
"""


def upstream_app():  # type: ignore[no-untyped-def]
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    def authorized(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {TOKEN}"

    async def small(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"message": "Bad credentials"}, 401)
        return JSONResponse({"id": 1, "login": "octocat", "name": "Mona Lisa Octocat"})

    async def big(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"message": "Bad credentials"}, 401)
        mib = int(request.query_params.get("mb", "1"))

        async def body() -> AsyncIterator[bytes]:
            for _ in range(mib):
                yield CHUNK

        return StreamingResponse(body(), headers={"content-length": str(mib << 20)})

    return Starlette(routes=[Route("/api/small", small), Route("/api/big", big)])


async def seed(db_url: str, vault_key: str) -> str:
    """An API key and a grant of the bench user at the `bench` provider, written as the sidecar would."""
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
        user = Identity("https://login.example.com", "bench-user")
        ring = load_key_ring([vault_key], None, None)
        assert ring is not None
        tokens = TokenSet(TOKEN, "Bearer", None, None, ("read",))
        key_id, blob = Vault(ring).encrypt_json(
            tokens.to_json(), aad=grant_aad(user.issuer, user.subject, "bench", "1")
        )
        # The API key's tenant: only it may use the grant (tenant isolation).
        grant = GrantRecord(
            new_id(16), user, "bench", "1", ("read",), key_id, blob, None, now, now, tenant=record.tenant
        )
        await store.grants.upsert(grant)
        return key
    finally:
        await store.close()


async def latencies(
    client: httpx.AsyncClient, routes: dict[str, tuple[str, dict[str, str]]], calls: int, pids: dict[str, int]
) -> dict[str, tuple[list[float], dict[str, float]]]:
    """Sequential GETs on each route (name -> url, headers), interleaved in blocks of BLOCK so that a machine that
    slows down or speeds up during the run weighs on every route alike: per route, each call's time (ms) and the
    CPU per call (ms) of each process in `pids` meanwhile."""
    for url, headers in routes.values():
        for _ in range(50):  # warm-up: connections, caches
            (await client.get(url, headers=headers)).raise_for_status()
    samples: dict[str, list[float]] = {name: [] for name in routes}
    cpu = {name: dict.fromkeys(pids, 0.0) for name in routes}
    for _ in range(0, calls, BLOCK):
        for name, (url, headers) in routes.items():
            before = {process: cpu_ms(pid) for process, pid in pids.items()}
            for _ in range(BLOCK):
                start = time.perf_counter()
                response = await client.get(url, headers=headers)
                samples[name].append((time.perf_counter() - start) * 1000)
                response.raise_for_status()
            for process, pid in pids.items():
                cpu[name][process] += cpu_ms(pid) - before[process]
    return {
        name: (samples[name], {process: ms / len(samples[name]) for process, ms in cpu[name].items()})
        for name in routes
    }


async def throughput(client: httpx.AsyncClient, url: str, mib: int, rounds: int, headers: dict[str, str]) -> float:
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        received = 0
        async with client.stream("GET", url, params={"mb": str(mib)}, headers=headers) as response:
            response.raise_for_status()
            async for chunk in response.aiter_raw():
                received += len(chunk)
        assert received == mib << 20
        best = max(best, mib / (time.perf_counter() - start))
    return best


async def main(
    calls: int,
    mib: int,
    rounds: int,
    log_format: str,
    compare_with: Path | None,
    profile: Path | None = None,
    servers: tuple[str, ...] = (),
) -> None:
    from service.vault import generate_key

    load_at_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    # The sidecars: this checkout's, another checkout's when comparing, this checkout's under other servers (all on
    # the same database and API); each as the command that runs it and the directory it runs in.
    serve = [sys.executable, "-m", "service.cli", "serve"]
    checkouts: dict[str, tuple[list[str], Path]] = {
        "proxy": ([sys.executable, "-c", PROFILED_SERVE, str(profile), "serve"] if profile else serve, ROOT)
    }
    if compare_with:
        checkouts["other"] = (serve, compare_with)
    for server in servers:
        checkouts[server] = ([sys.executable, __file__, "--serve-sidecar", server], ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        up_port = free_port()
        ports = {name: free_port() for name in checkouts}
        upstream = f"http://127.0.0.1:{up_port}"
        if "nginx" in checkouts:
            checkouts["nginx"] = (nginx_command(Path(tmp), ports["nginx"], up_port), ROOT)
        catalog = Path(tmp) / "providers.toml"
        catalog.write_text(
            f'[bench]\ndisplay_name = "Bench API"\nauthorization_endpoint = "{upstream}/authorize"\n'
            f'token_endpoint = "{upstream}/token"\napi_base_url = "{upstream}/api"\n'
        )
        vault_key = generate_key("k1")
        db_url = f"sqlite+aiosqlite:///{tmp}/bench.db"
        api_key = await seed(db_url, vault_key)
        log = open(Path(tmp) / "processes.log", "wb")  # noqa: ASYNC230 - closed below
        processes = {
            "upstream": await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--upstream", str(up_port), stdout=log, stderr=log
            )
        }
        for name, (command, checkout) in checkouts.items():
            env = {
                **connector_env(ports[name], db_url, vault_key, catalog),
                "CONNECTOR_PROVIDER_BENCH_CLIENT_ID": "bench",
                "CONNECTOR_PROVIDER_BENCH_CLIENT_SECRET": "bench-secret",
                "CONNECTOR_LOG_FORMAT": log_format,
                "BENCH_API": f"{upstream}/api",  # for the bare proxy
            }
            # `-m service.cli` from the checkout's directory runs that checkout's code.
            processes[name] = await asyncio.create_subprocess_exec(
                *command, env=env, cwd=checkout, stdout=log, stderr=log
            )
        try:
            await wait_until_up(f"{upstream}/api/small", within=60)  # a loaded machine, a profiled sidecar
            for port in ports.values():
                await wait_until_up(f"http://127.0.0.1:{port}/healthz", within=60)
            direct_headers = {"Authorization": f"Bearer {TOKEN}"}
            proxy_headers = {
                "Authorization": f"Bearer {api_key}",
                "Connector-User-Issuer": "https://login.example.com",
                "Connector-User-Subject": "bench-user",
            }
            bases = {"direct": f"{upstream}/api"}
            bases.update({name: f"http://127.0.0.1:{port}/v1/proxy/bench" for name, port in ports.items()})
            headers = {name: direct_headers if name == "direct" else proxy_headers for name in bases}
            pids = {"client": os.getpid(), **{name: process.pid for name, process in processes.items()}}
            async with httpx.AsyncClient(timeout=120) as client:
                routes = {name: (f"{base}/small", headers[name]) for name, base in bases.items()}
                measured = await latencies(client, routes, calls, pids)
                rates = {
                    name: await throughput(client, f"{base}/big", mib, rounds, headers[name])
                    for name, base in bases.items()
                }
        finally:
            for name, process in processes.items():
                if profile and name == "proxy":  # cProfile writes its file on KeyboardInterrupt, not on SIGTERM
                    process.send_signal(signal.SIGINT)
                else:
                    process.terminate()
                await process.wait()
            log.close()

    direct_p50 = statistics.median(measured["direct"][0])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    cpu = {name: measured[name][1] for name in measured}
    print(
        f"Measured on {platform.machine()} {platform.system()}, {os.cpu_count()} CPU, Python "
        f"{platform.python_version()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average at the start "
        f"{load_at_start}, at the end {load}."
    )
    print()
    print("| measure | value | goal | |")
    print("|---|---|---|---|")
    for name in checkouts:
        label = _label(name, compare_with)
        spent, idle = cpu[name][name], cpu["direct"][name]
        against = "" if name == "proxy" else f"; {spent / cpu['proxy']['proxy']:.2f}x the stock sidecar's"
        print(
            f"| CPU of {label} per small proxied GET (`/proc/<pid>/stat`; the API itself: "
            f"{cpu['direct']['upstream']:.2f} ms a call) | {spent:.2f} ms ({spent - idle:.2f} ms beyond its idle "
            f"work meanwhile{against}) | <= {CPU_GOAL_MS} ms | {'met' if spent <= CPU_GOAL_MS else 'NOT met'} |"
        )
        added = statistics.median(measured[name][0]) - direct_p50
        print(
            f"| added p50 latency of a small GET through {label} ({calls} sequential calls a route, interleaved) | "
            f"{added:.2f} ms | < {ADDED_P50_GOAL_MS} ms | {'met' if added < ADDED_P50_GOAL_MS else 'NOT met'} |"
        )
        ratio = rates[name] / rates["direct"]
        print(
            f"| download throughput through {label}, best of {rounds} x {mib} MiB | {rates[name]:.1f} MiB/s "
            f"(direct {rates['direct']:.1f}): {ratio:.2f}x | >= 0.5x | {'met' if ratio >= 0.5 else 'NOT met'} |"
        )
    print()
    print(f"Sidecar log format {log_format}. Latency (ms), p50 / p99, and CPU per call of each process (ms):")
    print()
    print("```")
    for name, (samples, spent_by) in measured.items():
        spent = ", ".join(f"{process} {ms:.2f}" for process, ms in spent_by.items())
        print(f"{name:8s} {statistics.median(samples):7.2f} / {percentile(samples, 99):7.2f}   CPU: {spent}")
    print("```")


def nginx_command(tmp: Path, port: int, upstream_port: int) -> list[str]:
    """nginx in front of the API with the token set in its configuration: the data path of a compiled reverse proxy
    (one process, keep-alive to the API, streaming, an access line per request), for scale."""
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"""daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {tmp}/nginx-access.log;
    client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp};
    scgi_temp_path {tmp};
    upstream api {{ server 127.0.0.1:{upstream_port}; keepalive 16; }}
    server {{
        listen 127.0.0.1:{port};
        location = /healthz {{ return 200 "ok"; }}
        location /v1/proxy/bench/ {{
            proxy_pass http://api/api/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer {TOKEN}";
            proxy_buffering off;
        }}
    }}
}}
"""
    )
    return [shutil.which("nginx") or "nginx", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "nginx-error.log")]


def _label(name: str, compare_with: Path | None) -> str:
    if name == "proxy":
        return "the sidecar"
    if name == "other":
        return f"the sidecar of {compare_with}"
    if name == "nginx":
        return "nginx with the token in its configuration (a compiled proxy's data path)"
    if name.startswith("bare"):
        return f"a bare Python proxy on {'granian' if name.endswith('granian') else 'uvicorn with h11'}"
    return f"the sidecar on {name}"


def serve_sidecar(server: str) -> None:
    """The sidecar as `acp-connector serve` runs it (settings from the environment, the same runtime and app), under
    `server` instead of uvicorn with h11 on asyncio."""
    from service.config import load_settings
    from service.logs import configure

    settings = load_settings(None, env=dict(os.environ))
    configure(settings.log_format)
    if server.endswith("uvloop"):
        import uvloop

        uvloop.run(_serve_sidecar(settings, server))
    else:
        asyncio.run(_serve_sidecar(settings, server))


def with_access_line(app: Any) -> Any:
    """`app` writing uvicorn's access line as uvicorn does (at the response's start, in its shape), for a server
    that writes none of its own: the connector's access log costs the same on every server compared."""
    from urllib.parse import quote

    access_log = logging.getLogger("uvicorn.access")

    async def logged(scope: Any, receive: Any, send: Any) -> None:
        async def send_logged(message: Any) -> None:
            if message["type"] == "http.response.start":
                client = scope.get("client")
                access_log.info(
                    '%s - "%s %s HTTP/%s" %d',
                    f"{client[0]}:{client[1]}" if client else "",
                    scope["method"],
                    quote(scope.get("root_path", "") + scope["path"]),
                    scope["http_version"],
                    message["status"],
                )
            await send(message)

        await app(scope, receive, send_logged if scope["type"] == "http" else send)

    return logged


def bare_proxy(api: str) -> Any:
    """The least a proxy in Python does on this stack: `/v1/proxy/bench/<path>` sent on to `<api>/<path>` with the
    token set, over an httpx pool as the sidecar's, the answer read whole (small) or relayed as it comes."""
    pool = httpx.AsyncHTTPTransport()
    prefix = "/v1/proxy/bench/"
    authorization = f"Bearer {TOKEN}".encode()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if not scope["path"].startswith(prefix):  # /healthz
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        query = scope["query_string"]
        url = f"{api}/{scope['path'][len(prefix) :]}" + (f"?{query.decode()}" if query else "")
        response = await pool.handle_async_request(
            httpx.Request(scope["method"], url, headers=[(b"authorization", authorization)])
        )
        headers = [(n.lower(), v) for n, v in response.headers.raw if n.lower() not in (b"date", b"server")]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        if int(response.headers.get("content-length", "0")) <= 65536:
            body = b"".join([chunk async for chunk in stream])
            await send({"type": "http.response.body", "body": body})
        else:
            async for chunk in stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        await stream.aclose()

    return app


async def _serve_sidecar(settings: Any, server: str) -> None:
    from service.app import build_runtime, build_web_app

    if server.startswith("bare"):  # no runtime, no access line
        logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
        await _serve_on(bare_proxy(os.environ["BENCH_API"]), settings, server)
        return
    runtime = build_runtime(settings)
    await runtime.start()
    try:
        await _serve_on(build_web_app(runtime), settings, server)
    finally:
        await runtime.close()


async def _serve_on(app: Any, settings: Any, server: str) -> None:
    from service.web.server import bind, make_server

    host, port = settings.server.host, settings.server.port
    if server.endswith("granian"):
        from granian.constants import HTTPModes, Interfaces
        from granian.server.embed import Server as Granian

        # No lifespan (a runtime is started before), HTTP/1.1, one Rust I/O thread; the connector's access line
        # (uvicorn's) where uvicorn writes it, and no line of granian's own.
        served = app if server.startswith("bare") else with_access_line(app)
        await Granian(
            served, address=host, port=port, interface=Interfaces.ASGINL, http=HTTPModes.http1, log_access=False
        ).serve()
        return
    uvicorn = make_server(app, host, port)
    if server.startswith("httptools"):
        uvicorn.config.http = "httptools"
    await uvicorn.serve(sockets=[bind(host, port)])


def serve_upstream(port: int) -> None:
    import uvicorn

    uvicorn.run(
        upstream_app(), host="127.0.0.1", port=port, log_level="warning", access_log=False, http="h11", loop="asyncio"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int)
    parser.add_argument("--mib", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--quick", action="store_true", help="fewer calls, a smaller download (a smoke run)")
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    parser.add_argument(
        "--compare-with", type=Path, metavar="CHECKOUT", help="also run another checkout's sidecar, interleaved"
    )
    parser.add_argument(
        "--profile", type=Path, metavar="FILE", help="run this checkout's sidecar under cProfile, its stats to FILE"
    )
    parser.add_argument(
        "--servers",
        type=lambda value: tuple(name for name in value.split(",") if name),
        default=(),
        metavar="LIST",
        help=f"also run this checkout's sidecar under each of these servers, interleaved: {', '.join(SERVERS)}",
    )
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-sidecar", choices=[s for s in SERVERS if s != "nginx"], help=argparse.SUPPRESS)
    options = parser.parse_args()
    if unknown := set(options.servers) - set(SERVERS):
        parser.error(f"--servers: unknown {', '.join(sorted(unknown))} (known: {', '.join(SERVERS)})")
    if missing := [f"{name}: {need}" for name in options.servers if (need := server_missing(name))]:
        parser.error(f"--servers: not installed here: {'; '.join(missing)}")
    if options.upstream:
        serve_upstream(options.upstream)
    elif options.serve_sidecar:
        serve_sidecar(options.serve_sidecar)
    else:
        asyncio.run(
            main(
                options.calls or (300 if options.quick else 1000),
                options.mib or (20 if options.quick else 200),
                options.rounds or (1 if options.quick else 3),
                options.log_format,
                options.compare_with,
                options.profile,
                options.servers,
            )
        )
