"""The sweeper survives a database outage: it logs, backs off, retries, and expires what is due once the database
is back. The outage is real: PostgreSQL refuses new connections to the database and ends the open ones."""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from service import ElicitationStatus, RequestScope

from .acp_peers import eventually
from .conftest import POSTGRES_ENV, Deploy, fresh_postgres_database

pytestmark = pytest.mark.postgres


async def _set_outage(url: str, down: bool) -> None:
    name = make_url(url).database
    admin = create_async_engine(os.environ[POSTGRES_ENV], isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with admin.connect() as conn:
            await conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"false" if down else "true"}')
            if down:
                await conn.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": name},
                )
    finally:
        await admin.dispose()


async def test_the_sweeper_survives_a_database_outage(deploy_with: Deploy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="service.sweeper")
    async with (
        fresh_postgres_database(migrated=True) as url,
        deploy_with(CONNECTOR_DATABASE__URL=url, CONNECTOR_ELICITATION__SWEEP_INTERVAL_SECONDS="0.02") as deployment,
    ):
        connector = deployment.connector
        record = await connector.runtime.elicitations.create(
            connection_key="conn-1",
            user=deployment.local_user,
            provider="github",
            scopes=["repo"],
            scope=RequestScope(1),
        )
        sweeper = connector.runtime.sweeper
        assert sweeper.running

        await _set_outage(url, down=True)
        try:
            connector.clock.advance(timedelta(seconds=connector.settings.elicitation.ttl_seconds))
            await eventually(lambda: _failures_logged(caplog, 3), "the sweeper logs three failed sweeps in a row")
            assert sweeper.running  # still running: it retries
        finally:
            await _set_outage(url, down=False)

        await eventually(
            lambda: _status(connector, record.id, ElicitationStatus.EXPIRED), "the due elicitation is expired"
        )
        await eventually(lambda: _recovery_logged(caplog), "the sweeper logs that it works again")
        assert sweeper.running
        expired = await connector.runtime.store.audit.list(elicitation_id=record.id, event="expired")
        assert len(expired) == 1


async def _failures_logged(caplog: pytest.LogCaptureFixture, count: int) -> bool:
    return any(f"sweep failed ({count} in a row)" in r.getMessage() for r in caplog.records)


async def _recovery_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any("sweep works again" in r.getMessage() for r in caplog.records)


async def _status(connector, elicitation_id: str, status: ElicitationStatus) -> bool:  # type: ignore[no-untyped-def]
    record = await connector.elicitation(elicitation_id)
    return record is not None and record.status is status
