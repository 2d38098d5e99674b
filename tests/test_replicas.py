"""Several connector processes on one PostgreSQL database: the completion reaches the ACP connection whichever replica
the browser used, exactly once; it is recorded undeliverable when the replica holding the connection is gone; the
event bus survives losing its connection; and an expired grant is refreshed once for all of them.

Every replica is a real, separate process: the GitHub example agent (an ACP agent embedding the connector, driven
over stdio by the official SDK's client side), `acp-connector serve`, or `tests/replica_worker.py`. The provider is
the mock provider served over loopback HTTP, rotating refresh tokens and counting every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from acp import text_block
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service import ElicitationStatus, Identity
from service.config import ReplicaSettings
from service.core.handles import grant_aad
from service.core.records import TokenSet
from service.events.bus import LocalBus
from service.events.replica import Replica
from service.metrics import Metrics
from service.store import PoolSettings, Store, migrate
from service.testing import MockOAuthProvider, ScriptedBrowser, ScriptedClient, spawn_agent
from service.testing.acp_client import SpawnedAgent
from service.vault import generate_key

from .conftest import ALICE, Deployment, deploy, fresh_postgres_database, write_catalog
from .test_tokens import authorize, refreshes

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[1]
USES_PER_REPLICA = 500


@dataclass
class Cluster:
    provider: MockOAuthProvider
    env: dict[str, str]  # the CONNECTOR_* settings every replica shares
    database_url: str


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    provider = MockOAuthProvider(refresh_delay=0.2)  # the rotation happens 0.2 s before the answer leaves
    async with provider.serve_http(), fresh_postgres_database() as database_url:
        catalog = write_catalog(tmp_path / "providers.toml", {"github": provider.catalog_entry()})
        config = tmp_path / "connector.toml"
        config.write_text("# every setting comes from CONNECTOR_* variables\n")
        env = {
            "CONNECTOR_CONFIG": str(config),
            "CONNECTOR_DATABASE__URL": database_url,
            "CONNECTOR_VAULT__KEYS": generate_key("k1"),
            "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
            "CONNECTOR_IDENTITY__LOCAL__ISSUER": ALICE.issuer,
            "CONNECTOR_IDENTITY__LOCAL__SUBJECT": ALICE.subject,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": provider.client_id,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": provider.client_secret,
        }
        yield Cluster(provider, env, database_url)


@pytest.fixture
async def seeded(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Deployment]:
    """A connector in this process that ran the real flow once: Alice holds a GitHub grant."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        env = {
            **cluster.env,
            "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
            "CONNECTOR_SERVER__PORT": str(port),
        }
        async with deploy(env, tmp_path, cluster.provider, sock) as deployment:
            await authorize(deployment)
            yield deployment


async def expire_stored_tokens(deployment: Deployment) -> TokenSet:
    """Make Alice's grant expired everywhere: its stored expiry is past and the provider refuses its token."""
    runtime = deployment.connector.runtime
    (grant,) = await runtime.store.grants.find(ALICE, "github")
    aad = grant_aad(ALICE.issuer, ALICE.subject, "github", grant.provider_account_id)
    tokens = TokenSet.from_json(runtime.vault.decrypt_json(grant.token_key_id, grant.token_ciphertext, aad=aad))
    past = datetime.now(UTC) - timedelta(minutes=5)
    expired = TokenSet.from_json({**tokens.to_json(), "expires_at": past.timestamp()})
    key_id, blob = runtime.vault.encrypt_json(expired.to_json(), aad=aad)
    await runtime.store.grants.update_tokens(
        grant.id,
        token_key_id=key_id,
        token_ciphertext=blob,
        token_expires_at=past,
        scopes=grant.scopes,
        now=past,
        replacing=grant.token_ciphertext,
    )
    deployment.provider.expire_access_tokens()
    return expired


async def run_replicas(
    env: dict[str, str], count: int, uses: int, user: Identity = ALICE, provider: str | None = None
) -> list[dict[str, dict[str, int]]]:
    """Start `count` replica processes, let them all start using `user`'s grant (at `provider`, github by default)
    at once, and collect their results."""
    process_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    worker = ("tests.replica_worker", str(uses), user.issuer, user.subject, *([provider] if provider else []))
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            *worker,
            cwd=REPO,
            env=process_env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 180)  # a loaded machine starts slowly
            assert line.strip() == b"ready", line
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        outputs = await asyncio.wait_for(asyncio.gather(*(proc.communicate() for proc in procs)), 120)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    results = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return results


@pytest.mark.duration(11)
async def test_two_replicas_refresh_an_expired_grant_exactly_once(seeded: Deployment, cluster: Cluster) -> None:
    provider = cluster.provider
    before = await expire_stored_tokens(seeded)
    refreshes_before, calls_before = refreshes(seeded), len(provider.api_calls)

    results = await run_replicas(cluster.env, 2, USES_PER_REPLICA)

    # Exactly one refresh for both processes, no failures, and no request ever sent with a dead token: the
    # provider answered every first attempt (a 401 would have cost a retry, i.e. a second API call).
    assert refreshes(seeded) - refreshes_before == 1
    assert [r["errors"] for r in results] == [{}, {}]
    assert [r["statuses"] for r in results] == [{"200": USES_PER_REPLICA}] * 2
    assert len(provider.api_calls) - calls_before == 2 * USES_PER_REPLICA
    # The rotated refresh token is the one stored; the one it replaced is dead at the provider.
    runtime = seeded.connector.runtime
    (grant,) = await runtime.store.grants.find(ALICE, "github")
    stored = seeded.connector.runtime.tokens.decrypt(grant)
    assert stored.refresh_token == provider.issued_refresh_tokens[-1] != before.refresh_token
    assert stored.access_token == provider.issued_access_tokens[-1]
    events = [e.event for e in await runtime.store.audit.list() if e.event.startswith("refresh")]
    assert events == ["refreshed"]


@pytest.mark.duration(11)
async def test_two_replicas_during_a_provider_outage_make_one_refresh_attempt_per_backoff_step(
    seeded: Deployment, cluster: Cluster
) -> None:
    """The token endpoint answers 503 while both replicas need a refresh: the first attempt's backoff, written on
    the grant under its lock, holds every other use on both replicas back from the provider; nothing stored
    changes, each use raises the retryable error; once the backoff ran out and the provider recovered, the next
    use refreshes with no user involved."""
    provider = cluster.provider
    before = await expire_stored_tokens(seeded)
    refreshes_before = refreshes(seeded)
    provider.token_outages.extend([(503, {})] * 50)
    # A backoff far longer than the run: every attempt after the first falls within its first step.
    slow = {**cluster.env, "CONNECTOR_GRANTS__REFRESH_RETRY_INITIAL_SECONDS": "120"}

    results = await run_replicas(slow, 2, 20)

    assert refreshes(seeded) - refreshes_before == 1  # one attempt for both processes and all 40 uses
    assert [r["errors"] for r in results] == [{"ProviderUnavailable": 20}] * 2
    runtime = seeded.connector.runtime
    (grant,) = await runtime.store.grants.find(ALICE, "github")
    assert runtime.tokens.decrypt(grant) == before  # nothing stored changed
    assert grant.health.status.value == "active" and grant.health.failures == 1
    assert grant.health.next_attempt_at is not None

    # The provider recovers; past the backoff the next use refreshes, nobody asked.
    provider.token_outages.clear()
    seeded.connector.clock.advance(timedelta(minutes=10))
    async with seeded.connector.http(ALICE, "github") as github:
        assert (await github.get("user")).status_code == 200
    assert refreshes(seeded) - refreshes_before == 2
    (healed,) = await runtime.store.grants.find(ALICE, "github")
    assert healed.health.failures == 0 and runtime.tokens.decrypt(healed).refresh_token != before.refresh_token


# -- the completion across replicas ---------------------------------------------------------------------------------
# Waiters that never poll and replicas that never sweep: only the event bus can tell replica A in time.
BUS_ONLY = {
    "CONNECTOR_EVENTS__POLL_INTERVAL_SECONDS": "60",
    "CONNECTOR_REPLICAS__HEARTBEAT_SECONDS": "600",
    "CONNECTOR_REPLICAS__DEAD_AFTER_SECONDS": "3600",
}
# Replicas that notice quickly that one of them is gone.
QUICK_SWEEPS = {"CONNECTOR_REPLICAS__HEARTBEAT_SECONDS": "0.5", "CONNECTOR_REPLICAS__DEAD_AFTER_SECONDS": "2"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def replica_b(cluster: Cluster, **overrides: str) -> AsyncIterator[str]:
    """`acp-connector serve` on its own port (no ACP connection): the replica the browser talks to. Its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        **cluster.env,
        "CONNECTOR_PUBLIC_BASE_URL": url,
        "CONNECTOR_SERVER__PORT": str(port),
        "PYTHONPATH": str(REPO),
        **overrides,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service.cli", "serve", cwd=REPO, env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                if proc.returncode is not None:
                    assert proc.stderr is not None
                    raise AssertionError(f"replica B stopped: {(await proc.stderr.read()).decode()}")
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{url}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("replica B did not become ready")
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def replica_a(cluster: Cluster, client: ScriptedClient, public_url: str, port: int, **overrides: str):  # type: ignore[no-untyped-def]
    """The GitHub example agent (replica A, holding the ACP connection); its links point at `public_url`."""
    env = {
        **cluster.env,
        "CONNECTOR_PUBLIC_BASE_URL": public_url,
        "CONNECTOR_SERVER__PORT": str(port),
        "PYTHONUNBUFFERED": "1",
        **overrides,
    }
    return spawn_agent(client, sys.executable, "-m", "examples.github_agent", env=env, cwd=REPO)


async def start_prompt(client: ScriptedClient, agent: SpawnedAgent) -> tuple[str, asyncio.Task[Any]]:
    await asyncio.wait_for(client.initialize(agent.conn), 30)
    session_id = (await asyncio.wait_for(agent.conn.new_session(cwd=str(REPO)), 10)).session_id
    prompt = asyncio.create_task(agent.conn.prompt(session_id=session_id, prompt=[text_block("list my repos")]))
    return session_id, prompt


async def authorize_on(url: str, replica: str, provider: MockOAuthProvider) -> None:
    """The user's browser: the whole flow at replica `replica` (and the provider), nowhere else."""
    async with ScriptedBrowser() as browser:
        final = await browser.authorize(url)
        assert final.status_code == 200, final.text
        assert "You can close this tab" in final.text
        hosts = {response.request.url.netloc.decode() for response in browser.responses}
    assert hosts == {httpx.URL(replica).netloc.decode(), httpx.URL(provider.base_url).netloc.decode()}


@asynccontextmanager
async def reading(database_url: str) -> AsyncIterator[Store]:
    store = Store.from_url(database_url)
    try:
        yield store
    finally:
        await store.close()


async def audit_events(database_url: str, elicitation_id: str) -> list[tuple[str, dict[str, Any]]]:
    async with reading(database_url) as store:
        return [(e.event, e.detail) for e in await store.audit.list(elicitation_id=elicitation_id)]


async def eventually(check: Callable[[], Awaitable[bool]], what: str, within: float = 30) -> None:
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 - the condition lives in another process or the database
            await asyncio.sleep(0.05)


async def listener_pids(database_url: str, replica_id: str) -> list[int]:
    async with reading(database_url) as store, store.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE application_name = :name"),
            {"name": f"acp-connector listen {replica_id}"},
        )
        return [int(pid) for (pid,) in rows.all()]


async def assert_told_once(client: ScriptedClient, database_url: str, elicitation_id: str) -> None:
    completes = client.received("elicitation/complete")
    assert [c["params"] for c in completes] == [{"elicitationId": elicitation_id}]
    assert client.completions == [elicitation_id] and client.ignored == [] and client.violations == []
    events = [event for event, _ in await audit_events(database_url, elicitation_id)]
    assert events.count("completion_sent") == 1 and "completion_undeliverable" not in events
    async with reading(database_url) as store:
        record = await store.elicitations.get(elicitation_id)
    assert record is not None and record.status is ElicitationStatus.COMPLETED


@pytest.fixture
async def migrated(cluster: Cluster) -> Cluster:
    migrate(cluster.database_url)
    return cluster


@pytest.mark.duration(10)
async def test_the_browser_on_replica_b_completes_the_request_on_replica_a_exactly_once(migrated: Cluster) -> None:
    cluster, client = migrated, ScriptedClient("accept")
    async with replica_b(cluster, **BUS_ONLY) as b_url, replica_a(cluster, client, b_url, free_port(), **BUS_ONLY) as a:
        session_id, prompt = await start_prompt(client, a)
        elicitation = await client.next_consented(within=30)
        assert elicitation.url == f"{b_url}/connect/{elicitation.elicitation_id}"

        await authorize_on(elicitation.url, b_url, cluster.provider)

        result = await asyncio.wait_for(prompt, 30)
        assert result.stop_reason == "end_turn", a.stderr()
    await assert_told_once(client, cluster.database_url, elicitation.elicitation_id)
    assert "octocat/hello-world" in client.agent_text(session_id)  # authorized, and the grant used server-side


@pytest.mark.duration(7)
async def test_a_completion_whose_replica_is_gone_is_recorded_undeliverable(migrated: Cluster) -> None:
    cluster, client = migrated, ScriptedClient("accept")
    async with replica_b(cluster, **QUICK_SWEEPS) as b_url:
        async with replica_a(cluster, client, b_url, free_port(), **QUICK_SWEEPS) as a:
            _, prompt = await start_prompt(client, a)
            elicitation = await client.next_consented(within=30)
            a.process.kill()  # replica A dies with the client's connection, after the create
            await a.process.wait()
            prompt.cancel()
        async with reading(cluster.database_url) as store:
            created = await store.elicitations.get(elicitation.elicitation_id)
        assert created is not None and created.replica_id is not None

        await authorize_on(elicitation.url, b_url, cluster.provider)  # the user still finishes, on replica B

        async def recorded() -> bool:
            events = await audit_events(cluster.database_url, elicitation.elicitation_id)
            return any(event == "completion_undeliverable" for event, _ in events)

        await eventually(recorded, "replica B records the completion undeliverable")
    events = await audit_events(cluster.database_url, elicitation.elicitation_id)
    undeliverable = [detail for event, detail in events if event == "completion_undeliverable"]
    assert undeliverable == [{"reason": "replica_gone", "replica_id": created.replica_id}]
    assert "completion_sent" not in [event for event, _ in events]
    assert client.received("elicitation/complete") == []
    async with reading(cluster.database_url) as store:
        assert len(await store.grants.find(ALICE, "github")) == 1  # the grant is stored all the same
        record = await store.elicitations.get(elicitation.elicitation_id)
    assert record is not None and record.status is ElicitationStatus.COMPLETED


@pytest.mark.duration(4)
async def test_the_bus_reconnects_after_its_connection_is_terminated_mid_flow(migrated: Cluster) -> None:
    cluster, client = migrated, ScriptedClient("accept")
    a_port = free_port()
    async with replica_b(cluster, **BUS_ONLY) as b_url, replica_a(cluster, client, b_url, a_port, **BUS_ONLY) as a:
        session_id, prompt = await start_prompt(client, a)
        elicitation = await client.next_consented(within=30)
        async with reading(cluster.database_url) as store:
            created = await store.elicitations.get(elicitation.elicitation_id)
        assert created is not None and created.replica_id is not None
        (old_pid,) = await listener_pids(cluster.database_url, created.replica_id)

        async with reading(cluster.database_url) as store, store.engine.connect() as conn:
            terminated = await conn.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": old_pid})
        assert terminated is True

        async def listening_again() -> bool:
            pids = await listener_pids(cluster.database_url, created.replica_id or "")
            return len(pids) == 1 and pids[0] != old_pid

        await eventually(listening_again, "replica A listens again")
        await authorize_on(elicitation.url, b_url, cluster.provider)

        result = await asyncio.wait_for(prompt, 30)
        assert result.stop_reason == "end_turn", a.stderr()
        async with httpx.AsyncClient() as http:
            scraped = (await http.get(f"http://127.0.0.1:{a_port}/metrics")).text
    await assert_told_once(client, cluster.database_url, elicitation.elicitation_id)
    assert "acp_connector_event_bus_reconnects_total 1.0" in scraped
    assert "octocat/hello-world" in client.agent_text(session_id)


class Partition:
    """A TCP proxy in front of PostgreSQL that can cut every connection through it and refuse new ones."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0
        self._last_traffic = 0.0

    async def __aenter__(self) -> Partition:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.sever()

    async def quiet(self, seconds: float) -> None:
        """Return once nothing has crossed the proxy for `seconds` (the replica behind it is idle, waiting)."""
        loop = asyncio.get_running_loop()
        while loop.time() - self._last_traffic < seconds:  # noqa: ASYNC110 - traffic is observed, not awaited
            await asyncio.sleep(0.05)

    def sever(self) -> None:
        """Cut every connection now (new ones are refused while `cut` is set)."""
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        if self.cut:  # cut while this one was connecting
            up_writer.close()
            writer.close()
            return
        self._writers.update({writer, up_writer})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    self._last_traffic = asyncio.get_running_loop().time()
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@pytest.mark.duration(5)
async def test_a_replica_cut_off_from_the_database_catches_up_when_it_is_back(migrated: Cluster) -> None:
    """Replica A loses the database while the browser finishes on B: no notification can reach it. Once back, the
    bus's catch-up finds the elicitation ended and A tells the client."""
    cluster, client = migrated, ScriptedClient("accept")
    upstream = make_url(cluster.database_url)
    async with Partition((upstream.host or "127.0.0.1", upstream.port or 5432)) as partition:
        through_proxy = upstream.set(host="127.0.0.1", port=partition.port).render_as_string(hide_password=False)
        a_env = {**BUS_ONLY, "CONNECTOR_DATABASE__URL": through_proxy}
        async with (
            replica_b(cluster, **BUS_ONLY) as b_url,
            replica_a(cluster, client, b_url, free_port(), **a_env) as a,
        ):
            session_id, prompt = await start_prompt(client, a)
            elicitation = await client.next_consented(within=30)

            async def consented() -> bool:
                async with reading(cluster.database_url) as store:
                    record = await store.elicitations.get(elicitation.elicitation_id)
                return record is not None and record.status is ElicitationStatus.CONSENTED

            await eventually(consented, "replica A recorded the consent")
            await partition.quiet(0.5)  # A waits for an event now, touching the database no more
            partition.cut = True
            partition.sever()
            await authorize_on(elicitation.url, b_url, cluster.provider)  # completed while A hears nothing
            assert client.received("elicitation/complete") == []
            partition.cut = False

            # Well before the event log's interval poll (60 s) could find it: only the catch-up can.
            result = await asyncio.wait_for(prompt, 30)
            assert result.stop_reason == "end_turn", a.stderr()
        await assert_told_once(client, cluster.database_url, elicitation.elicitation_id)
        assert "octocat/hello-world" in client.agent_text(session_id)


async def test_the_heartbeat_gets_through_while_requests_hold_every_pooled_connection() -> None:
    # Requests holding the whole pool for `dead_after_seconds` would otherwise silence a live replica: the others
    # would take it for gone and settle its completions undeliverable (seen under a burst of 100,000 pendings).
    async with fresh_postgres_database(migrated=True) as url:
        store = Store.from_url(url, PoolSettings(size=1, overflow=0, timeout=1))
        try:
            beat_at = datetime.now(UTC).replace(microsecond=0)
            async with store.db.writer.connect():  # every pooled connection taken
                await asyncio.wait_for(store.replicas.beat("busy-replica", now=beat_at), 10)
            async with store.db.reader.connect() as conn:
                rows = (await conn.execute(text("SELECT id, heartbeat_at FROM replicas"))).all()
            assert [(row[0], row[1]) for row in rows] == [("busy-replica", beat_at)]
        finally:
            await store.close()


async def test_a_replica_keeps_beating_while_its_sweep_waits_for_a_pooled_connection() -> None:
    # The sweep (orphans, gone replicas, catch-up) needs a pooled connection; while requests hold them all it waits
    # up to the pool's timeout, which is longer than `dead_after_seconds` by default (30 s each). Were the beat
    # queued behind it, the others would take this live replica for gone (seen under a burst of cancellations).
    settings = ReplicaSettings(heartbeat_seconds=0.1, dead_after_seconds=0.6)
    async with fresh_postgres_database(migrated=True) as url:
        store = Store.from_url(url, PoolSettings(size=1, overflow=0, timeout=30))
        watcher = Store.from_url(url)
        replica = Replica(store, LocalBus(), settings, lambda: datetime.now(UTC), Metrics())
        try:
            await replica.start()
            gaps: list[float] = []
            async with store.db.writer.connect():  # every pooled connection taken for 2 s: the sweep waits
                for _ in range(20):
                    await asyncio.sleep(0.1)
                    async with watcher.db.reader.connect() as conn:
                        beat = (await conn.execute(text("SELECT heartbeat_at FROM replicas"))).scalar_one()
                    gaps.append((datetime.now(UTC) - beat).total_seconds())
            assert max(gaps) < settings.dead_after_seconds, gaps
        finally:
            await replica.close()
            await store.close()
            await watcher.close()
