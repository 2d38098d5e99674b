"""A backlog of expiries is worked off in small batches that let the rest of the process run between them, and each
elicitation is still expired exactly once: one `expired` audit row, one event in the event log, its waiters told.
On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from datetime import timedelta

import pytest

from service import ElicitationStatus, RequestScope
from service.core.events import ElicitationEvent
from service.core.sweeper import EXPIRE_BATCH

from .conftest import Deploy, Deployment

BACKLOG = 2 * EXPIRE_BATCH + 7  # two full batches and a part
NO_BACKGROUND_SWEEP = {"CONNECTOR_ELICITATION__SWEEP_INTERVAL_SECONDS": "3600"}  # the test sweeps itself


async def _backlog(deployment: Deployment, n: int) -> list[str]:
    """`n` elicitations whose time is up."""
    connector = deployment.connector
    ids = []
    for i in range(n):
        record = await connector.runtime.elicitations.create(
            connection_key="conn-1",
            user=deployment.local_user,
            provider="github",
            scopes=["repo"],
            scope=RequestScope(i),
        )
        ids.append(record.id)
    connector.clock.advance(timedelta(seconds=connector.settings.elicitation.ttl_seconds))
    return ids


async def _expired_once_each(deployment: Deployment, ids: list[str]) -> None:
    store = deployment.connector.runtime.store
    audited = Counter(e.elicitation_id for e in await store.audit.list(event="expired"))
    assert audited == dict.fromkeys(ids, 1)
    logged = await store.outbox.after(0, limit=10 * len(ids))
    assert Counter(e.elicitation_id for e in logged) == dict.fromkeys(ids, 1)
    assert {e.status for e in logged} == {ElicitationStatus.EXPIRED}
    for elicitation_id in ids:
        record = await deployment.connector.elicitation(elicitation_id)
        assert record is not None and record.status is ElicitationStatus.EXPIRED


async def test_a_backlog_is_expired_in_batches_with_the_loop_free_between_them(
    deploy_with: Deploy, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url, **NO_BACKGROUND_SWEEP) as deployment:
        runtime = deployment.connector.runtime
        ids = await _backlog(deployment, BACKLOG)

        turns = 0  # how often another task got the event loop

        async def other_task() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        batches: list[tuple[int, int, int]] = []  # each batch: turns when it started, when it ended, how many
        expire_due = runtime.elicitations.expire_due

        async def watched(*, limit: int) -> int:
            started = turns
            expired = await expire_due(limit=limit)
            batches.append((started, turns, expired))
            return expired

        monkeypatch.setattr(runtime.elicitations, "expire_due", watched)
        with contextlib.ExitStack() as waiting:
            waiters = {i: waiting.enter_context(runtime.bus.waiter(i)) for i in ids}
            ticking = asyncio.create_task(other_task())
            try:
                result = await runtime.sweeper.sweep()
            finally:
                ticking.cancel()

            assert result.expired == BACKLOG
            assert [n for _, _, n in batches] == [EXPIRE_BATCH, EXPIRE_BATCH, 7]
            # After each batch the sweeper rests: the other task ran before the next batch started.
            for (_, ended, _), (started, _, _) in itertools.pairwise(batches):
                assert started > ended
            told = {i: w.result() for i, w in waiters.items() if w.done()}
        assert set(told) == set(ids)
        assert all(isinstance(e, ElicitationEvent) and e.status is ElicitationStatus.EXPIRED for e in told.values())
        await _expired_once_each(deployment, ids)
        assert (await runtime.sweeper.sweep()).expired == 0


async def test_sweeps_at_the_same_time_expire_each_elicitation_once(deploy_with: Deploy, database_url: str) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url, **NO_BACKGROUND_SWEEP) as deployment:
        runtime = deployment.connector.runtime
        ids = await _backlog(deployment, BACKLOG)

        results = await asyncio.gather(*(runtime.sweeper.sweep() for _ in range(3)))

        assert sum(r.expired for r in results) == BACKLOG
        await _expired_once_each(deployment, ids)
