"""Shared fixtures: a migrated SQLite database, a mock provider, a connector served by uvicorn on loopback.

Also `deploy` / the `deploy_with` fixture (a connector with chosen settings and bound user) and
`fresh_postgres_database`, a throwaway PostgreSQL database for the store and migration tests.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import respx
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from service import Connector, Identity, load_settings
from service.store import migrate
from service.testing import MockKeyedApi, MockOAuthProvider
from service.vault import generate_key
from service.web.server import listening_socket, serving

ALICE = Identity("https://login.example.com", "alice")
BOB = Identity("https://login.example.com", "bob")
POSTGRES_ENV = "CONNECTOR_TEST_POSTGRES_URL"
REDIS_ENV = "CONNECTOR_TEST_REDIS_URL"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (a credential entry's fields, check)
        return "{" + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + "}"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_catalog(path: Path, entries: dict[str, dict[str, object]]) -> Path:
    lines = []
    for name, entry in entries.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in entry.items())
        lines.append("")
    path.write_text("\n".join(lines))
    return path


@asynccontextmanager
async def fresh_postgres_database(*, migrated: bool = False) -> AsyncIterator[str]:
    """A new, uniquely named database on the server in CONNECTOR_TEST_POSTGRES_URL, dropped afterwards.

    `migrated`: already at the head revision, copied from a template this process migrated once (the same
    schema `migrate` gives an empty database, in a fraction of the time); by default the database is empty.
    """
    admin_url = os.environ.get(POSTGRES_ENV)
    if not admin_url:
        pytest.skip(f"PostgreSQL tests need {POSTGRES_ENV} (e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test)")
    name = _database_name("test")
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        await _drop_abandoned(admin)
        template = f' TEMPLATE "{await _migrated_template(admin)}"' if migrated else ""
        async with admin.connect() as conn:
            await conn.exec_driver_sql(f'CREATE DATABASE "{name}"{template}')
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.dispose()


_templates: list[str] = []  # this process's migrated template database (at most one), dropped at the end
_swept: list[bool] = []  # whether this process dropped the databases of test processes that died (once)


def _database_name(kind: str) -> str:
    """`connector_<kind>_<pid>_<random>`: the pid tells a later run whether the process that made it still lives."""
    return f"connector_{kind}_{os.getpid()}_{uuid.uuid4().hex[:12]}"


async def _drop_abandoned(admin: AsyncEngine) -> None:
    """Drop the databases of test processes on this machine that no longer run (a run killed before its cleanup)."""
    if _swept:
        return
    _swept.append(True)
    async with admin.connect() as conn:
        names = (
            await conn.exec_driver_sql(
                r"SELECT datname FROM pg_database WHERE datname ~ '^connector_(test|template)_[0-9]+_[0-9a-f]+$'"
            )
        ).scalars()
        for name in list(names):
            pid = int(name.split("_")[2])
            try:
                os.kill(pid, 0)
                continue  # still running (or the pid was reused: the database stays, as before)
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            await conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _migrated_template(admin: AsyncEngine) -> str:
    if not _templates:
        name = _database_name("template")
        async with admin.connect() as conn:
            await conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        _templates.append(name)
        migrate(admin.url.set(database=name).render_as_string(hide_password=False))
    return _templates[0]


async def _drop_templates(admin_url: str) -> None:
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with admin.connect() as conn:
            while _templates:
                await conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{_templates.pop()}" WITH (FORCE)')
    finally:
        await admin.dispose()


@dataclass
class Deployment:
    """One connector instance on a real loopback port, with its mock provider."""

    connector: Connector
    provider: MockOAuthProvider
    base_url: str
    local_user: Identity


@pytest.fixture
def keyed() -> MockKeyedApi:
    """The keyed mock API (an API that takes an API key) of a credential test (`tests/credential_support.py`)."""
    return MockKeyedApi()


@pytest.fixture(autouse=True)
def no_stray_log_handlers() -> Iterator[None]:
    """What a test's `configure()` (the CLI run in-process, a served app) adds to the root logger goes with the test:
    a handler left writing to that test's captured stderr, closed afterwards, would turn every later log line into
    a "Logging error" traceback. pytest's own capture handlers (subclasses) are pytest's to manage. So do the levels
    it sets (`httpx`, `alembic`, the CLI's `service.audit` at WARNING): a later test capturing INFO would see nothing
    of those loggers, depending on which tests ran before it in its process."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    levels = {
        name: logger.level for name, logger in root.manager.loggerDict.items() if isinstance(logger, logging.Logger)
    }
    yield
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler and h not in before]:
        root.removeHandler(handler)
    root.setLevel(level)
    for name, logger in list(root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != levels.get(name, logging.NOTSET):
            logger.setLevel(levels.get(name, logging.NOTSET))


@pytest.fixture
def mock_provider() -> MockOAuthProvider:
    return MockOAuthProvider(base_url="https://github.mock-provider.test")


@pytest.fixture
def respx_router(mock_provider: MockOAuthProvider) -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        router.route(host="127.0.0.1").pass_through()
        mock_provider.install(router)
        yield router


@pytest.fixture
def loopback_socket() -> Iterator[socket.socket]:
    """A bound loopback socket the test's connector will serve on (TCP_NODELAY on its accepted connections)."""
    with listening_socket("127.0.0.1", 0) as sock:
        yield sock


@pytest.fixture
def connector_env(
    tmp_path: Path, mock_provider: MockOAuthProvider, loopback_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    port = loopback_socket.getsockname()[1]
    catalog = write_catalog(tmp_path / "providers.toml", {"github": mock_provider.catalog_entry()})
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'connector.db'}"
    env = {
        "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "CONNECTOR_SERVER__PORT": str(port),
        "CONNECTOR_DATABASE__URL": db_url,
        "CONNECTOR_VAULT__KEYS": generate_key("k1"),
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_AGENT_NAME": "Test Agent",
        "CONNECTOR_IDENTITY__LOCAL__ISSUER": ALICE.issuer,
        "CONNECTOR_IDENTITY__LOCAL__SUBJECT": ALICE.subject,
        "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": mock_provider.client_id,
        "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": mock_provider.client_secret,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CONNECTOR_CONFIG", raising=False)
    return env


@asynccontextmanager
async def deploy(
    env: dict[str, str],
    tmp_path: Path,
    provider: MockOAuthProvider,
    sock: socket.socket,
    user: Identity | None = None,
    schema_revision: str = "head",
    **overrides: str,
) -> AsyncIterator[Deployment]:
    """A connector with the test environment plus `overrides` (CONNECTOR_* names), on a real loopback port.

    `user` is whom the agent binds elicitations to; by default the local verifier's user. The database is
    migrated to `schema_revision` first.
    """
    settings_env = {**env, **overrides}
    config_file = tmp_path / "connector.toml"
    config_file.write_text("# all settings come from the environment in tests\n")
    settings = load_settings(config_file, env=settings_env)
    migrate(settings.database.url, schema_revision)
    connector = Connector.from_settings(settings)
    await connector.start()
    try:
        async with serving(connector.asgi_app(), sock):
            bound = user if user is not None else connector.verifier.user()
            yield Deployment(connector, provider, settings.public_base_url, bound)
    finally:
        await connector.close()


Deploy = Callable[..., AbstractAsyncContextManager[Deployment]]


@pytest.fixture
def deploy_with(
    connector_env: dict[str, str],
    tmp_path: Path,
    mock_provider: MockOAuthProvider,
    respx_router: respx.MockRouter,
    loopback_socket: socket.socket,
) -> Deploy:
    """`deploy_with(user=None, schema_revision="head", **overrides)`: `deploy` on this test's environment,
    mock provider and port."""

    def make(
        user: Identity | None = None, schema_revision: str = "head", **overrides: str
    ) -> AbstractAsyncContextManager[Deployment]:
        return deploy(connector_env, tmp_path, mock_provider, loopback_socket, user, schema_revision, **overrides)

    return make


@pytest.fixture
async def deployment(deploy_with: Deploy) -> AsyncIterator[Deployment]:
    async with deploy_with() as deployment:
        yield deployment


@pytest.fixture
def redis_url() -> str:
    """The Redis server in CONNECTOR_TEST_REDIS_URL (e.g. redis://127.0.0.1:6379/0); each test uses keys of its own."""
    url = os.environ.get(REDIS_ENV)
    if not url:
        pytest.skip(f"Redis tests need {REDIS_ENV} (e.g. redis://127.0.0.1:6379/0)")
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database_url(request: pytest.FixtureRequest, connector_env: dict[str, str]) -> AsyncIterator[str]:
    """The test's database, once per backend: the SQLite file of `connector_env`, or a fresh PostgreSQL database.

    A module runs its deployments on both with `deploy_with(CONNECTOR_DATABASE__URL=database_url)`.
    """
    if request.param == "sqlite":
        yield connector_env["CONNECTOR_DATABASE__URL"]
        return
    async with fresh_postgres_database(migrated=True) as url:
        yield url


@pytest.fixture
def captured_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests (marked `duration(seconds)`) start first, spread over the workers.

    pytest-xdist's worksteal hands each worker a contiguous share of the collection (the first n // workers tests
    to the first, ...) and steals from the end of a share: a long test placed at the start of a share is never
    the one left running while the other workers are idle.
    """
    timed = [(float(marker.args[0]), item) for item in items if (marker := item.get_closest_marker("duration"))]
    if not timed:
        return
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for seconds, item in sorted(timed, key=lambda timed_item: -timed_item[0]):
        least = loads.index(min(loads))
        heads[least].append(item)
        loads[least] += seconds
    long_ones = {id(item) for _, item in timed}
    rest = [item for item in items if id(item) not in long_ones]
    ordered: list[pytest.Item] = []
    pending = len(items)
    for worker, head in enumerate(heads):
        share = pending // (workers - worker)  # what worksteal sends this worker first
        pending -= share
        taken = max(0, share - len(head))
        ordered += head + rest[:taken]
        rest = rest[taken:]
    items[:] = ordered + rest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drops the migrated template database. In CI (CONNECTOR_REQUIRE_ALL_TESTS=1) a skipped test fails the run:
    nothing may silently not run."""
    if _templates:
        asyncio.run(_drop_templates(os.environ[POSTGRES_ENV]))
    if os.environ.get("CONNECTOR_REQUIRE_ALL_TESTS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        print(f"\nCONNECTOR_REQUIRE_ALL_TESTS: {len(skipped)} test(s) skipped; failing the run.")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
