"""A real sidecar: `acp-connector serve` in its own process, on loopback, with a mock provider served over HTTP.

The test process opens its own `Store` on the same database to read what the sidecar wrote, and makes API keys
in it the way `acp-connector api-keys create` does.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from service import Identity
from service.core.handles import grant_aad, new_id
from service.core.records import GrantRecord, TokenSet
from service.providers import provider_env_var
from service.store import Store, migrate
from service.testing import MockOAuthProvider
from service.vault import Vault, generate_key, load_key_ring
from service.web.server import make_server

from .api_support import make_key
from .conftest import ALICE, write_catalog

ROOT = Path(__file__).resolve().parent.parent
# How long a sidecar (or the mock provider) may take to come up: on a machine shared by several test runs, a Python
# process that imports the service can take a minute to start.
START_SECONDS = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Sidecar:
    base_url: str
    api_key: str
    store: Store
    local_user: Identity
    pid: int
    log_file: Path
    env: dict[str, str]

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")


def sidecar_env(
    tmp_path: Path, providers: dict[str, dict[str, object]], credentials: dict[str, tuple[str, str]]
) -> dict[str, str]:
    """The environment of a sidecar on a free loopback port with `providers` as its catalog."""
    port = free_port()
    catalog = write_catalog(tmp_path / "providers.toml", providers)
    env = {
        "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "CONNECTOR_SERVER__PORT": str(port),
        "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path / 'sidecar.db'}",
        "CONNECTOR_VAULT__KEYS": generate_key("k1"),
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_AGENT_NAME": "Test Agent",
        "CONNECTOR_IDENTITY__LOCAL__ISSUER": ALICE.issuer,
        "CONNECTOR_IDENTITY__LOCAL__SUBJECT": ALICE.subject,
    }
    for name, (client_id, secret) in credentials.items():
        env[provider_env_var(name, "CLIENT_ID")] = client_id
        env[provider_env_var(name, "CLIENT_SECRET")] = secret
    return env


@asynccontextmanager
async def sidecar_process(env: dict[str, str], log_file: Path, *, migrate_first: bool = True) -> AsyncIterator[int]:
    """`acp-connector serve` with `env` until the block ends; yields its pid once /healthz answers."""
    if migrate_first:
        migrate(env["CONNECTOR_DATABASE__URL"])
    base_url = env["CONNECTOR_PUBLIC_BASE_URL"]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    full_env.update(env)
    with log_file.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "service.cli", "serve", env=full_env, cwd=ROOT, stdout=log, stderr=log
        )
    try:
        await _serving(process, base_url, log_file)
        yield process.pid
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


async def _serving(process: asyncio.subprocess.Process, base_url: str, log_file: Path) -> None:
    """Return once the sidecar `process` answers at `base_url`."""
    deadline = time.monotonic() + START_SECONDS
    async with httpx.AsyncClient(timeout=2) as probe:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise RuntimeError(f"the sidecar exited with {process.returncode}; see {log_file}")
            try:
                # Our own server names its base URL in its OpenAPI document: no other server on the port.
                answer = await probe.get(f"{base_url}/v1/openapi.json")
                if answer.status_code == 200 and answer.json()["servers"][0]["url"] == base_url:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError("the sidecar did not come up")


class RestartableSidecar:
    """A sidecar process that a test kills (SIGKILL, as a crash) and starts again on the same port and database."""

    def __init__(self, env: dict[str, str], log_file: Path) -> None:
        self.env = env
        self.base_url = env["CONNECTOR_PUBLIC_BASE_URL"]
        self.log_file = log_file
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")} | self.env
        with self.log_file.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "service.cli", "serve", env=full_env, cwd=ROOT, stdout=log, stderr=log
            )
        await _serving(self._process, self.base_url, self.log_file)

    async def kill(self) -> None:
        """Gone at once: open connections (a long-poll) break, nothing answers until `start()`."""
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()


@asynccontextmanager
async def restartable_sidecar(
    tmp_path: Path, provider: MockOAuthProvider, **settings: str
) -> AsyncIterator[tuple[RestartableSidecar, Store, str]]:
    """A running `RestartableSidecar` with the mock provider served over HTTP (`settings`: more environment), a
    store on its database and an API key; killed when the block ends."""
    async with provider.serve_http():
        env = sidecar_env(
            tmp_path, {"github": provider.catalog_entry()}, {"github": (provider.client_id, provider.client_secret)}
        )
        migrate(env["CONNECTOR_DATABASE__URL"])
        sidecar = RestartableSidecar(env | settings, tmp_path / "sidecar.log")
        await sidecar.start()
        store = Store.from_url(env["CONNECTOR_DATABASE__URL"])
        try:
            yield sidecar, store, await make_key(store)
        finally:
            await sidecar.kill()
            await store.close()


@asynccontextmanager
async def running_sidecar(tmp_path: Path, provider: MockOAuthProvider) -> AsyncIterator[Sidecar]:
    """A sidecar process with the mock provider served over HTTP, a store on its database and an API key."""
    async with provider.serve_http():
        env = sidecar_env(
            tmp_path, {"github": provider.catalog_entry()}, {"github": (provider.client_id, provider.client_secret)}
        )
        log_file = tmp_path / "sidecar.log"
        async with sidecar_process(env, log_file) as pid:
            store = Store.from_url(env["CONNECTOR_DATABASE__URL"])
            try:
                key = await make_key(store)
                yield Sidecar(env["CONNECTOR_PUBLIC_BASE_URL"], key, store, ALICE, pid, log_file, env)
            finally:
                await store.close()


@dataclass
class SharedSidecar:
    """A sidecar process (and a mock provider process) that many tests share: each test brings its own API key,
    so its own tenant (elicitations, events and connections are the tenant's), and starts without grants."""

    base_url: str
    database_url: str
    log_file: Path


Popen = subprocess.Popen[bytes]

# The shared sidecar's provider refuses this scope at consent (a narrowed grant).
REFUSED_SCOPE = "refused-by-provider"

# Limits per client address count every test on the one loopback address; raised so tests cannot starve each
# other (the rate-limit tests run their own deployments).
SHARED_LIMITS = {
    f"CONNECTOR_RATE_LIMIT__{name}": "1000000"
    for name in ("CONNECT_PER_ADDRESS", "CALLBACK_PER_ADDRESS", "CONFIRM_PER_ADDRESS", "AUDIT_PER_ADDRESS")
}


@contextmanager
def shared_sidecar(tmp_path: Path) -> Iterator[SharedSidecar]:
    """`acp-connector mock-provider` and `acp-connector serve` in processes of their own until the block ends."""
    credentials = ("shared-client", "shared-secret")
    log_file = tmp_path / "sidecar.log"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    provider_env = {provider_env_var("github", "CLIENT_ID"): credentials[0]}
    provider_env[provider_env_var("github", "CLIENT_SECRET")] = credentials[1]
    with (
        log_file.open("ab") as log,
        _process(
            ["mock-provider", "--port", "0", "--narrow", REFUSED_SCOPE], {**base_env, **provider_env}, log
        ) as mock,
    ):
        provider = MockOAuthProvider(base_url=_mock_provider_url(mock))  # for its catalog entry only
        env = sidecar_env(tmp_path, {"github": provider.catalog_entry()}, {"github": credentials}) | SHARED_LIMITS
        migrate(env["CONNECTOR_DATABASE__URL"])
        with _process(["serve"], {**base_env, **env}, log, stdout=log) as sidecar:
            _wait_until_serving(sidecar, env["CONNECTOR_PUBLIC_BASE_URL"], log_file)
            yield SharedSidecar(env["CONNECTOR_PUBLIC_BASE_URL"], env["CONNECTOR_DATABASE__URL"], log_file)


@contextmanager
def _process(args: list[str], env: dict[str, str], log: IO[bytes], stdout: Any = subprocess.PIPE) -> Iterator[Popen]:
    """`acp-connector ARGS` in a process of its own (stderr to `log`) until the block ends."""
    command = [sys.executable, "-m", "service.cli", *args]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=stdout, stderr=log)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _mock_provider_url(process: Popen, timeout: float = START_SECONDS) -> str:
    """The base URL `acp-connector mock-provider` names in the first line it prints once it listens."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline().decode() if ready else ""
    prefix = "# mock OAuth provider at "
    if not line.startswith(prefix):
        raise RuntimeError(f"the mock provider did not start (exit status {process.poll()}, said {line!r})")
    return line.removeprefix(prefix).split(";", 1)[0]


def _wait_until_serving(process: Popen, base_url: str, log_file: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    with httpx.Client(timeout=2) as probe:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the sidecar exited with {process.returncode}; see {log_file}")
            try:
                answer = probe.get(f"{base_url}/v1/openapi.json")
                if answer.status_code == 200 and answer.json()["servers"][0]["url"] == base_url:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)
    raise RuntimeError("the sidecar did not come up")


def bulk_api() -> Starlette:
    """A provider API for streaming tests: GET /api/big?mb=N streams N MiB (1 MiB chunks), bearer required."""
    chunk = b"\x00" * (1 << 20)

    async def big(request: Request) -> Response:
        if not request.headers.get("authorization", "").startswith("Bearer "):
            return JSONResponse({"message": "Bad credentials"}, 401)
        megabytes = int(request.query_params.get("mb", "1"))

        async def body() -> AsyncIterator[bytes]:
            for _ in range(megabytes):
                yield chunk

        return StreamingResponse(body(), headers={"content-length": str(megabytes << 20)})

    return Starlette(routes=[Route("/api/big", big)])


@asynccontextmanager
async def serve_app(app: Starlette) -> AsyncIterator[str]:
    """`app` on a free loopback port while the block runs; yields its base URL."""
    port = free_port()
    server = make_server(app, "127.0.0.1", port)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers a flag, not an event
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        await task


async def seed_grant(
    store: Store,
    vault_keys: str,
    user: Identity,
    provider: str,
    access_token: str,
    tenant: str = "agent-a",
    *,
    api_key: str | None = None,
) -> GrantRecord:
    """A stored grant for `user` at `provider`, as the callback would store it (encrypted, never expiring), made
    through `tenant` (by default `make_key`'s); with `api_key`, a credential entry's grant holding it (`api_key`)."""
    ring = load_key_ring([vault_keys], None, None)
    assert ring is not None
    now = datetime.now(UTC)
    tokens = TokenSet(access_token, "Bearer", None, None, ("read",))
    if api_key is not None:
        tokens = TokenSet.of_credential("api_key", {"api_key": api_key}, now=now.timestamp())
    key_id, blob = Vault(ring).encrypt_json(
        tokens.to_json(), aad=grant_aad(user.issuer, user.subject, provider, "acct-1")
    )
    record = GrantRecord(new_id(16), user, provider, "acct-1", ("read",), key_id, blob, None, now, now, tenant=tenant)
    return await store.grants.upsert(record)


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set size (VmHWM), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/<pid>/status")
