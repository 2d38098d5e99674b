"""The sweeper: one background task per process that expires due elicitations and applies retention.

Every `interval` it expires open elicitations whose time is up (in batches: each is audited, logged in the event
log and its waiters are told `expired`), and every `retention_interval` it deletes what is past its retention
window. Several processes may sweep the same database: each elicitation is expired exactly once. When the
database is unreachable the sweeper logs it, backs off and tries again; it never stops on an error.

A backlog (thousands due at once: after a restart, a bulk load, an outage) is worked off in small batches with a
rest after each, so that it never holds up the rest of the process or the database for long: a batch's commit is
followed by one synchronous stretch on the event loop (its audit lines logged, its events published and its
waiters told), which grows with the batch (~0.1 ms an elicitation on a quiet machine); and on SQLite a batch's
transaction holds the one writer, which the other processes' writes can take only between batches (they poll for
it on `busy_timeout`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from ..util.periodic import Periodic
from .lifecycle import Elicitations
from .retention import PurgeKind, RetentionPolicy, RetentionRepo, purge_due

log = logging.getLogger("service.sweeper")

EXPIRE_BATCH = 50  # the event loop's stretch after a batch's commit stays under ~10 ms (bench/sweeper_backlog.py)
MAX_EXPIRE_BATCHES = 40  # per sweep (2,000): a larger backlog is worked off over several sweeps
REST_PER_BATCH = 1.0  # after a full batch, rest this many times as long as it took: half the time is the others'
MAX_PURGE_BATCHES = 20  # per kind and pass
MAX_BACKOFF_SECONDS = 60.0


@dataclass
class SweepResult:
    expired: int = 0
    purged: dict[PurgeKind, int] = field(default_factory=dict)


class Sweeper:
    def __init__(
        self,
        elicitations: Elicitations,
        purged: RetentionRepo,
        retention: RetentionPolicy,
        *,
        interval: float,
        retention_interval: float,
    ) -> None:
        self.elicitations = elicitations
        self.purged = purged
        self.retention = retention
        self.interval = interval
        self.retention_interval = retention_interval
        self._last_purge: datetime | None = None
        self._loop = Periodic(
            self.sweep,
            interval=lambda: self.interval,
            max_backoff=MAX_BACKOFF_SECONDS,
            name="connector-sweeper",
            what="sweep",
            log=log,
        )

    @property
    def running(self) -> bool:
        """Whether the background task is alive (it stops only when closed)."""
        return self._loop.running

    def start(self) -> None:
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    async def sweep(self) -> SweepResult:
        """One pass: expire what is due, and apply retention when it is time. Raises on database errors."""
        result = SweepResult()
        for _ in range(MAX_EXPIRE_BATCHES):
            started = time.monotonic()
            expired = await self.elicitations.expire_due(limit=EXPIRE_BATCH)
            result.expired += expired
            if expired < EXPIRE_BATCH:
                break
            # The requests that waited meanwhile run now, and another process's write finds the writer free.
            await asyncio.sleep((time.monotonic() - started) * REST_PER_BATCH)
        now = self.elicitations.now()
        if self._last_purge is None or (now - self._last_purge).total_seconds() >= self.retention_interval:
            result.purged = await purge_due(self.purged, self.retention, now, max_batches=MAX_PURGE_BATCHES)
            self._last_purge = now
            if any(result.purged.values()):
                log.info("retention: deleted %s", ", ".join(f"{n} {k}" for k, n in result.purged.items() if n))
        return result
