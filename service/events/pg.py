"""The bus across replicas, on PostgreSQL LISTEN/NOTIFY.

`publish` tells this process's waiters and listeners at once, then the other replicas with a NOTIFY on one channel
(`codec.py`: ids only, never a secret). Each replica holds one listening connection (`store.notify`). An elicitation
event is announced by its id in the event log: a replica that hears it reads the log from its cursor
(`OutboxFeed.catch_up`, the same read as the interval poll, which stays as a safety net) and hands what it finds to
its waiters and listeners (an SSE stream among them). Reads triggered by a burst of notifications coalesce. An
elicitation event's notification carries its row of the log: when it is the next event after the replica's cursor it
is handed on at once, without the read (`OutboxFeed.follow`; a read of the log was a quarter of the median
cross-replica completion, bench/RESULTS.md); a gap (an event not heard, or heard out of order) falls back to the read.
A grant change, which the log does not hold, travels whole, so every replica's caches drop the grant at once.

The database stays the truth: a waiter is resolved by what the log says, and the telling of a completion is decided
by a conditional update, so an event heard twice is harmless and one not heard costs latency, never correctness.

If the listening connection ends (the server terminated it, the network failed, a ping got no answer), the bus
reconnects with capped exponential backoff, counts it (`acp_connector_event_bus_reconnects_total`), and catches up
on what it could not hear meanwhile: the event log from its cursor, the grants changed meanwhile, and whatever
else registered with `after_reconnect` (the replica's untold completions).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta

from service.core.events import Event, GrantChange, GrantChanged
from service.metrics import Metrics
from service.store import Store
from service.store.notify import PgListener, notify

from .bus import LocalBus
from .codec import decode, encode

log = logging.getLogger("service.events")

CHANNEL = "acp_connector_events"
BACKOFF_FIRST_SECONDS = 0.05
BACKOFF_MAX_SECONDS = 5.0
# Grants changed this long before the connection was found lost are announced again after a reconnect.
CATCH_UP_MARGIN = timedelta(seconds=60)


class PgBus(LocalBus):
    def __init__(self, store: Store, *, metrics: Metrics, clock: Callable[[], datetime], ping_seconds: float) -> None:
        super().__init__()
        self.store = store
        self.origin = store.origin  # a replica ignores what it sent itself
        self.metrics = metrics
        self.now = clock
        self.ping_seconds = ping_seconds
        self._listener: PgListener | None = None
        self._lost = asyncio.Event()
        self._lost_at: datetime | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[None] | None = None
        self._read_again = False
        self._sending: set[asyncio.Task[None]] = set()
        self._outgoing: list[str] = []  # payloads published in this turn of the event loop, sent together
        self._flush_due = False
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self._listen()
        except Exception as exc:  # the supervisor keeps trying; the interval poll covers the waiters meanwhile
            log.warning("event bus cannot listen yet: %s", type(exc).__name__)
            self._mark_lost()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"event-bus-{self.origin}")

    async def close(self) -> None:
        self._closing = True
        for task in (self._supervisor, self._reading):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._sending:
            await asyncio.wait(self._sending, timeout=5)
        if self._listener is not None:
            await self._listener.close()

    # -- sending ---------------------------------------------------------------------------------------
    def publish(self, event: Event) -> None:
        self.dispatch(event)
        self._outgoing.append(encode(event, self.origin))
        if not self._flush_due:  # events published together (a completion's grant change, then its end) share one
            self._flush_due = True  # NOTIFY round trip, in order
            task = asyncio.get_running_loop().create_task(self._flush())
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _flush(self) -> None:
        self._flush_due = False
        payloads, self._outgoing = self._outgoing, []
        await self._send(payloads)

    async def _send(self, payloads: list[str]) -> None:
        """NOTIFY through the listening connection (one round trip for all), else through a pooled one."""
        listener = self._listener
        if listener is not None and not listener.closed:
            try:
                await listener.notify(*payloads)
                return
            except Exception as exc:
                log.warning("event bus connection failed to send: %s", type(exc).__name__)
                self._mark_lost()
        try:
            for payload in payloads:
                await notify(self.store.engine, CHANNEL, payload)
        except Exception as exc:  # the others still read the log (interval poll) and re-read what they cache
            log.warning("event not announced to the other replicas: %s", type(exc).__name__)

    # -- receiving -------------------------------------------------------------------------------------
    def _received(self, payload: str) -> None:
        try:
            heard = decode(payload)
        except ValueError as exc:
            log.warning("ignored a notification on %s: %s", CHANNEL, exc)
            return
        follow = self.log_follower
        if heard.logged is not None and follow is not None and follow(heard.logged):
            return  # the next event of the log, heard whole (our own moves the cursor on): no read needed
        if heard.origin == self.origin:
            return
        if heard.grant_change is not None:
            self.dispatch(heard.grant_change)
        else:
            self._read_log()

    def _read_log(self) -> None:
        """Read the event log now; a notification that arrives while reading makes one more read, not a queue."""
        if self._reading is not None and not self._reading.done():
            self._read_again = True
            return
        self._reading = asyncio.get_running_loop().create_task(self._read_log_until_quiet())

    async def _read_log_until_quiet(self) -> None:
        while self.log_reader is not None:
            self._read_again = False
            try:
                await self.log_reader()
            except Exception as exc:  # the interval poll retries
                log.warning("reading the event log after a notification failed: %s", type(exc).__name__)
                return
            if not self._read_again:
                return

    # -- the listening connection ----------------------------------------------------------------------
    async def _listen(self) -> None:
        self._lost.clear()
        self._listener = await PgListener.open(
            self.store.db.url, CHANNEL, name=self.origin, on_payload=self._received, on_lost=self._mark_lost
        )

    def _mark_lost(self) -> None:
        if self._closing or self._lost.is_set():
            return
        self._lost_at = self.now()
        self._lost.set()

    async def _supervise(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._lost.wait(), timeout=self.ping_seconds)
            except TimeoutError:
                try:
                    if self._listener is not None:
                        await self._listener.ping()
                    continue
                except Exception as exc:
                    log.warning("event bus connection does not answer: %s", type(exc).__name__)
                    self._mark_lost()
            await self._reconnect()

    async def _reconnect(self) -> None:
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        delay = BACKOFF_FIRST_SECONDS
        while True:
            try:
                await self._listen()
                break
            except Exception as exc:
                log.warning("event bus reconnect failed: %s; retrying in %.2f s", type(exc).__name__, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # noqa: S311 - jitter, not a secret
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)
        self.metrics.bus_reconnected()
        log.info("event bus reconnected; catching up")
        try:
            await self._catch_up()
        except Exception as exc:  # the interval poll and the replica's heartbeat cover it
            log.warning("event bus catch-up failed: %s", type(exc).__name__)

    async def _catch_up(self) -> None:
        """Announce here what may have happened while no notification could arrive."""
        if self.log_reader is not None:
            await self.log_reader()
        since = (self._lost_at or self.now()) - CATCH_UP_MARGIN
        for grant in await self.store.grants.changed_since(since):
            self.dispatch(GrantChanged(grant.id, grant.identity, grant.provider, GrantChange.REFRESHED))
        for hook in self.reconnect_hooks:
            await hook()
