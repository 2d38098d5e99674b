"""The event log and the shared feed, on SQLite and PostgreSQL.

The log is read by "id > last seen", so ids must become visible in increasing order even when writers commit
out of step; the feed brings other processes' events to this process's waiters (and never re-publishes its own).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from service.core.events import ElicitationEvent, GrantChange, GrantChanged, LoggedEvent
from service.core.identity import Identity
from service.core.states import ElicitationStatus
from service.events import LocalBus, OutboxFeed
from service.events.codec import decode, encode
from service.events.pg import PgBus
from service.metrics import Metrics
from service.store import Store

from .conftest import fresh_postgres_database
from .test_store import store  # noqa: F401 - the fixture

WRITERS = 60


def completed(elicitation_id: str) -> ElicitationEvent:
    return ElicitationEvent(elicitation_id, ElicitationStatus.COMPLETED, "conn-1")


async def test_a_reader_by_last_seen_id_misses_no_event_of_concurrent_writers(store: Store) -> None:  # noqa: F811
    """Writers hold their transaction open for a random while after appending; a reader (another process, with
    its own connections) that only asks for "id > the last id it saw" still sees every event exactly once."""
    elsewhere = Store.from_url(store.db.url.render_as_string(hide_password=False))
    seen: list[int] = []
    done = asyncio.Event()

    async def writer(n: int) -> None:
        await asyncio.sleep(random.random() * 0.05)
        async with store.transaction() as tx:
            await store.outbox.append([completed(f"e{n}")], at=datetime.now(UTC), conn=tx)
            await asyncio.sleep(random.random() * 0.05)  # commit later, while others append and commit

    async def reader() -> None:
        last = 0
        while True:
            finished = done.is_set()
            for event in await elsewhere.outbox.after(last):
                assert event.id is not None and event.id > last
                seen.append(event.id)
                last = event.id
            if finished:
                return
            await asyncio.sleep(0.002)

    reading = asyncio.create_task(reader())
    try:
        await asyncio.gather(*(writer(n) for n in range(WRITERS)))
        done.set()
        await reading
    finally:
        await elsewhere.close()

    logged = [e.id for e in await store.outbox.after(0)]
    assert len(logged) == WRITERS
    assert seen == logged  # every event, once, in id order


async def test_the_feed_brings_other_processes_events_to_waiters_here(store: Store) -> None:  # noqa: F811
    other = Store(store.db, origin="other-process")  # another process writing to the same database
    bus = LocalBus()
    heard: list[ElicitationEvent] = []
    bus.add_listener(lambda e: heard.append(e) if isinstance(e, ElicitationEvent) else None)
    feed = OutboxFeed(store.outbox, bus, interval=60)
    await feed.start()  # from the newest event on; the interval is long: the test calls catch_up itself
    try:
        async with store.transaction() as tx:  # an event this process wrote (and published at its commit)
            await store.outbox.append([completed("mine")], at=datetime.now(UTC), conn=tx)
        with bus.waiter("theirs") as waiter:
            async with other.transaction() as tx:
                await other.outbox.append([completed("theirs")], at=datetime.now(UTC), conn=tx)
            assert not waiter.done()

            assert await feed.catch_up() == 1

            event = waiter.result()
            assert event is not None and event.elicitation_id == "theirs" and event.origin == "other-process"
        assert [e.elicitation_id for e in heard] == ["theirs"]  # our own event is not published twice
        assert await feed.catch_up() == 0
    finally:
        await feed.close()


class _CountedLog:
    """The store's event log, counting its reads."""

    def __init__(self, on: Store) -> None:
        self.inner = on.outbox
        self.origin = on.outbox.origin
        self.reads = 0

    async def after(self, last_id: int, *, limit: int = 500) -> list[LoggedEvent]:
        self.reads += 1
        return await self.inner.after(last_id, limit=limit)

    async def last_id(self) -> int:
        return await self.inner.last_id()


async def test_an_event_heard_whole_and_next_in_the_log_is_taken_without_reading_the_log(store: Store) -> None:  # noqa: F811
    other = Store(store.db, origin="other-process")
    bus = LocalBus()
    heard: list[ElicitationEvent] = []
    bus.add_listener(lambda e: heard.append(e) if isinstance(e, ElicitationEvent) else None)
    log = _CountedLog(store)
    feed = OutboxFeed(log, bus, interval=60)
    await feed.start()
    try:
        async with other.transaction() as tx:
            first, second = await other.outbox.append(
                [completed("one"), completed("two")], at=datetime.now(UTC), conn=tx
            )
        as_logged = await store.outbox.after(first.id - 1)  # type: ignore[operator]
        # What a replica's NOTIFY carries (the sender publishes the event it logged, with its replica id).
        notified = [decode(encode(replace(e, replica_id="r1"), "other-process")).logged for e in (first, second)]
        assert notified == [replace(e, origin="other-process") for e in as_logged]  # the log's row, as read
        assert notified[1] is not None and not bus.log_follower(notified[1])  # type: ignore[misc]  # a gap: read

        with bus.waiter("one") as waiter:
            assert notified[0] is not None and bus.log_follower(notified[0])  # type: ignore[misc]
            assert waiter.result() == as_logged[0]
        assert notified[1] is not None and bus.log_follower(notified[1])  # type: ignore[misc]
        assert log.reads == 0 and [e.elicitation_id for e in heard] == ["one", "two"]
        assert await feed.catch_up() == 0  # nothing published twice

        async with store.transaction() as tx:  # this process's own event moves the cursor, published by nobody
            (mine,) = await store.outbox.append([completed("mine")], at=datetime.now(UTC), conn=tx)
        assert bus.log_follower(decode(encode(mine, store.origin)).logged)  # type: ignore[arg-type, misc]
        assert feed.cursor == mine.id and len(heard) == 2
    finally:
        await feed.close()


@pytest.mark.postgres
async def test_events_published_together_cross_in_one_notify_in_order() -> None:
    """A completion publishes its grant change, then its end: the other replica hears both, in that order, from one
    NOTIFY statement (the end does not wait for the grant change's round trip)."""
    async with fresh_postgres_database(migrated=True) as url:
        here, there = Store.from_url(url), Store.from_url(url)
        sender = PgBus(here, metrics=Metrics(), clock=lambda: datetime.now(UTC), ping_seconds=30)
        receiver = PgBus(there, metrics=Metrics(), clock=lambda: datetime.now(UTC), ping_seconds=30)
        heard: list[object] = []
        receiver.add_listener(heard.append)
        feed = OutboxFeed(there.outbox, receiver, interval=60)
        await feed.start()
        await sender.start()
        await receiver.start()
        statements: list[tuple[str, ...]] = []
        assert sender._listener is not None
        notify = sender._listener.notify

        async def counted(*payloads: str) -> None:
            statements.append(payloads)
            await notify(*payloads)

        sender._listener.notify = counted  # type: ignore[method-assign]
        try:
            async with here.transaction() as tx:
                (ended,) = await here.outbox.append([completed("e1")], at=datetime.now(UTC), conn=tx)
            change = GrantChanged("g1", Identity("https://idp", "alice"), "github", GrantChange.STORED)
            sender.publish(change)
            sender.publish(ended)
            async with asyncio.timeout(10):
                while len(heard) < 2:  # noqa: ASYNC110 - the receiver's listener is a plain callback
                    await asyncio.sleep(0.01)
            assert len(statements) == 1 and len(statements[0]) == 2
            assert heard[0] == change
            assert isinstance(heard[1], ElicitationEvent) and heard[1].elicitation_id == "e1"
        finally:
            await sender.close()
            await receiver.close()
            await feed.close()
            await here.close()
            await there.close()
