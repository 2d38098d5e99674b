"""This process as one of the replicas sharing the database: its id, its heartbeat, and what it sweeps.

Every `heartbeat_seconds` (two bounded tasks per process, on SQLite and PostgreSQL alike) a replica:
- records that it is alive (`replicas` row), in a task of its own on a connection outside the pool: work that
  waits for a pooled connection (the sweep below, while requests hold them all) never delays a beat, or the
  others would take a live replica for gone;
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
from collections.abc import Awaitable, Callable
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
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Announce this replica, then beat and sweep until `close`."""
        await self.beat()
        self._tasks = [
            asyncio.create_task(self._every_beat(self.beat, "replica heartbeat"), name=f"replica-{self.id}"),
            asyncio.create_task(self._every_beat(self.sweep, "replica sweep"), name=f"replica-sweep-{self.id}"),
        ]

    async def close(self) -> None:
        """Stop beating and leave: other replicas settle what this one's connections were waiting for."""
        if self._tasks:
            tasks, self._tasks = self._tasks, []
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):
                await self.store.replicas.remove(self.id)

    async def _every_beat(self, work: Callable[[], Awaitable[object]], what: str) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            try:
                await work()
            except Exception as exc:  # a database outage: log it, and try again next time
                log.warning("%s failed: %s", what, type(exc).__name__)

    async def beat(self) -> None:
        await self.store.replicas.beat(self.id, now=self.now())

    async def sweep(self) -> None:
        live_since = self.now() - timedelta(seconds=self.settings.dead_after_seconds)
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
