"""This process as one of the replicas sharing the database: its id, its heartbeat, and what it sweeps.

Every `heartbeat_seconds` (one bounded task per process, on SQLite and PostgreSQL alike) a replica:
- records that it is alive (`replicas` row);
- settles as undeliverable the completions whose replica is gone (silent for `dead_after_seconds`): their
  connection went with that process, so `elicitation/complete` can never be sent (`completion_undeliverable`,
  reason `replica_gone`), and removes the rows of gone replicas;
- announces again, in this process only, its own completions that nobody has started to tell (an event it missed,
  e.g. while its bus was reconnecting): the delivery listener then tells them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from service.config import ReplicaSettings
from service.core.events import ElicitationEvent
from service.metrics import CompletionResult, Metrics
from service.store import Store

from .bus import LocalBus

log = logging.getLogger("service.events")

REPLICA_GONE = "replica_gone"


class Replica:
    """The replica's id is its store's `origin` (random per process: a restarted process is a new replica), the
    name its changes carry in the event log too."""

    def __init__(
        self,
        store: Store,
        bus: LocalBus,
        settings: ReplicaSettings,
        clock: Callable[[], datetime],
        metrics: Metrics,
    ) -> None:
        self.id = store.origin
        self.store = store
        self.dispatch = bus.dispatch  # hands an event to this process's listeners only
        bus.after_reconnect(self.catch_up)  # what it could not hear while the bus was reconnecting
        self.settings = settings
        self.now = clock
        self.metrics = metrics
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Announce this replica, then beat until `close`."""
        await self.store.replicas.beat(self.id, now=self.now())
        self._task = asyncio.create_task(self._run(), name=f"replica-{self.id}")

    async def close(self) -> None:
        """Stop beating and leave: other replicas settle what this one's connections were waiting for."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            with contextlib.suppress(Exception):
                await self.store.replicas.remove(self.id)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            try:
                await self.tick()
            except Exception as exc:  # a database outage: log it, and beat again next time
                log.warning("replica heartbeat failed: %s", type(exc).__name__)

    async def tick(self) -> None:
        now = self.now()
        await self.store.replicas.beat(self.id, now=now)
        live_since = now - timedelta(seconds=self.settings.dead_after_seconds)
        await self.abandon_orphans(live_since)
        await self.store.replicas.remove_gone(live_since=live_since)
        await self.catch_up()

    async def abandon_orphans(self, live_since: datetime) -> int:
        """Record as undeliverable the completions whose replica stopped beating before `live_since`."""
        store = self.store
        async with store.transaction() as tx:
            orphans = await store.elicitations.abandon_completions(live_since=live_since, conn=tx)
            for record in orphans:
                await store.audit.record(
                    "completion_undeliverable",
                    elicitation_id=record.id,
                    identity=record.identity,
                    provider=record.provider,
                    detail={"reason": REPLICA_GONE, "replica_id": record.replica_id},
                    now=self.now(),
                    conn=tx,
                )
        for _ in orphans:
            self.metrics.completion(CompletionResult.UNDELIVERABLE)
        return len(orphans)

    async def catch_up(self) -> None:
        """Announce (here only) this replica's completions that nobody has started to tell."""
        for record in await self.store.elicitations.completions_to_tell(self.id):
            self.dispatch(
                ElicitationEvent(record.id, record.status, record.connection_key, replica_id=record.replica_id)
            )
