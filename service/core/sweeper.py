"""The sweeper: one background task per process that expires due elicitations and applies retention.

Every `interval` it expires open elicitations whose time is up (in batches: each is audited, logged in the event
log and its waiters are told `expired`), and every `retention_interval` it deletes what is past its retention
window. Several processes may sweep the same database: each elicitation is expired exactly once. When the
database is unreachable the sweeper logs it, backs off and tries again; it never stops on an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from ..util.periodic import Periodic
from .lifecycle import Elicitations
from .retention import PurgeKind, RetentionPolicy, RetentionRepo, purge_due

log = logging.getLogger("service.sweeper")

EXPIRE_BATCH = 200
MAX_EXPIRE_BATCHES = 10  # per sweep: a backlog is worked off over several sweeps, the writer stays available
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
            expired = await self.elicitations.expire_due(limit=EXPIRE_BATCH)
            result.expired += expired
            if expired < EXPIRE_BATCH:
                break
        now = self.elicitations.now()
        if self._last_purge is None or (now - self._last_purge).total_seconds() >= self.retention_interval:
            result.purged = await purge_due(self.purged, self.retention, now, max_batches=MAX_PURGE_BATCHES)
            self._last_purge = now
            if any(result.purged.values()):
                log.info("retention: deleted %s", ", ".join(f"{n} {k}" for k, n in result.purged.items() if n))
        return result
