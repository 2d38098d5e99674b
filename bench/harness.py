"""What the benchmarks share: loopback servers, child processes in one process group, percentiles, the machine.

Everything listens on 127.0.0.1 only, on sockets from `service.web.server.listening_socket` (TCP_NODELAY on
accepted connections: otherwise every keep-alive request would stall on Nagle's algorithm).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from service.web.server import listening_socket, serving

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    with listening_socket("127.0.0.1") as sock:
        return int(sock.getsockname()[1])


def connector_env(port: int, database_url: str, vault_keys: str, catalog: Path | str) -> dict[str, str]:
    """The environment of a connector process serving on loopback `port`: this process's, without any CONNECTOR_*
    setting of its own, and the deployment's database, vault keys and provider catalog (add the rest to it)."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")},
        "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "CONNECTOR_SERVER__PORT": str(port),
        "CONNECTOR_DATABASE__URL": database_url,
        "CONNECTOR_VAULT__KEYS": vault_keys,
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
    }


async def serve_on_loopback(app: Any, port: int) -> None:
    """Serve an ASGI app on 127.0.0.1:`port` until cancelled (TCP_NODELAY on accepted connections)."""
    async with serving(app, listening_socket("127.0.0.1", port)) as running:
        await running.stopped()


class Children:
    """Child processes started in their own process group, all ended (by group) when the block ends."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(  # noqa: S603 - our own modules, fixed arguments
            [PYTHON, *args],
            cwd=REPO,
            env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self.processes.clear()


@contextlib.asynccontextmanager
async def children() -> AsyncIterator[Children]:
    group = Children()
    try:
        yield group
    finally:
        group.stop()


async def wait_until_up(url: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            try:
                await client.get(url)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not come up within {within:g} s") from None
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def postgres_database(admin_url: str, prefix: str = "bench") -> AsyncIterator[str]:
    """A PostgreSQL database of its own on `admin_url`'s server, for the block; dropped afterwards (its
    connections closed by force)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with admin.connect() as conn:
            await conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.dispose()


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def machine() -> str:
    """One line about where the numbers were measured."""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}; "
        f"load average at start {load}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )


def cpu_ms(pid: int) -> float:
    """CPU time (user + system, all threads) the process `pid` has used so far, in ms: from /proc/<pid>/stat.

    What the benchmarks compare per flow or per call: on a shared machine it is far steadier than wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def rss_bytes() -> int:
    """This process's resident set size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")
