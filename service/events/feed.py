"""Events written by other processes, brought into this one: one shared poll of the event log for all waiters.

Every terminal change is logged in `elicitation_events` in its own transaction, with the writing process as
`origin`. This process publishes its own changes on its bus right after their commit; `OutboxFeed` brings the
others' changes: while anyone here waits, it asks the log for "id > last seen, not written by me" once per
interval (one query, however many waiters), and publishes what it finds. A database outage is logged and retried
with backoff; waiters keep waiting meanwhile.

The seam for cross-process notification: a LISTEN/NOTIFY listener calls `catch_up()` when notified and after
every reconnect, and the interval poll becomes a safety net. A Server-Sent-Events stream keeps its own cursor
(Last-Event-ID) and reads the same log with `OutboxRepository.after`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from service.core.events import ElicitationEvent, LoggedEvent
from service.util.periodic import Periodic

from .bus import LocalBus

log = logging.getLogger("service.events")

BATCH = 500
MAX_BACKOFF_SECONDS = 30.0


class EventLog(Protocol):
    origin: str

    async def after(self, last_id: int, *, limit: int = ...) -> list[LoggedEvent]: ...

    async def last_id(self) -> int: ...


class OutboxFeed:
    """The one background task per process that covers changes made elsewhere."""

    def __init__(self, log_: EventLog, bus: LocalBus, *, interval: float) -> None:
        self._log = log_
        self._bus = bus
        bus.read_log_with(self.catch_up, self.follow)  # a bus across processes reads the log when told of news
        self.interval = interval
        self.cursor: int | None = None  # the last event id seen; None until the first successful read
        self._lock = asyncio.Lock()
        self._loop = Periodic(
            self.catch_up,
            interval=lambda: self.interval,
            max_backoff=MAX_BACKOFF_SECONDS,
            name="connector-outbox-feed",
            what="reading the event log",
            log=log,
            # Nobody here waits: nothing to read (the cursor catches up when someone does).
            idle=lambda: self.cursor is not None and not self._bus.waiting(),
        )

    async def start(self) -> None:
        """Start at the newest logged event (older ones ended before anyone here could wait on them)."""
        if self.cursor is None:
            self.cursor = await self._log.last_id()
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    def follow(self, event: ElicitationEvent) -> bool:
        """Take `event`, announced whole by the process that logged it, if it is the next one after the cursor and
        no read is under way: as reading the log would (published here unless this process wrote it, the cursor
        moved on), without the read. False: read the log instead (a gap, or no cursor yet)."""
        if self.cursor is None or self._lock.locked() or event.id != self.cursor + 1:
            return False
        self.cursor = event.id
        if event.origin != self._log.origin:
            self._bus.dispatch(event)
        return True

    async def catch_up(self) -> int:
        """Publish every event logged by another process since the cursor; how many. Raises on database errors."""
        async with self._lock:
            if self.cursor is None:
                self.cursor = await self._log.last_id()
                return 0
            published = 0
            while True:
                events = await self._log.after(self.cursor, limit=BATCH)
                for event in events:
                    self.cursor = max(self.cursor, event.id or 0)
                    if event.origin != self._log.origin:  # our own were published at their commit
                        self._bus.dispatch(event)  # here only: the process that wrote it told the others
                        published += 1
                if len(events) < BATCH:
                    return published
