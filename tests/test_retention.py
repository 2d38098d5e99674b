"""Retention on SQLite and PostgreSQL: only what is past its window goes, in batches; grants never go; a webhook
delivery goes only once it has ended (with its attempts), never while it is pending."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from service.core.events import ElicitationEvent
from service.core.records import VerificationRecord, WebhookDeliveryRecord, WebhookEndpointRecord
from service.core.retention import PurgeKind, RetentionPolicy, count_due, purge_due
from service.core.states import DeliveryStatus, ElicitationStatus
from service.store import Store, migrate
from service.store.tables import (
    audit_events,
    elicitation_events,
    identity_verifications,
    oauth_flows,
    webhook_attempts,
    webhook_deliveries,
)

from .test_cli import cli
from .test_store import ALICE, NOW, elicitation, flow, grant, store  # noqa: F401 - `store` is the fixture

DAY = timedelta(days=1)
POLICY = RetentionPolicy(
    elicitation_days=30, verification_days=7, audit_days=365, event_days=7, webhook_delivery_days=7, batch_size=2
)


def verification(elicitation_id: str, expires_at: datetime) -> VerificationRecord:
    return VerificationRecord(
        id=uuid.uuid4().hex,
        elicitation_id=elicitation_id,
        verifier="oidc",
        handle_hash=uuid.uuid4().hex,
        return_hash=None,
        browser_binding_hash="binding",
        nonce=None,
        pkce_key_id=None,
        pkce_ciphertext=None,
        outcome=None,
        identity=None,
        created_at=expires_at - timedelta(minutes=10),
        expires_at=expires_at,
        confirmed_at=None,
        used_at=None,
    )


async def seed_deliveries(into: Store, *deliveries: tuple[str, DeliveryStatus, datetime | None]) -> None:
    """One endpoint, and for each (id, status, last attempt) a delivery with one attempt row per attempt made."""
    endpoint = WebhookEndpointRecord("wh_retention", "agent-a", "https://hooks.example/x", None, "k", b"x", 0, NOW)
    await into.webhooks.insert_endpoint(endpoint)
    cursor = await into.webhooks.cursor()
    records = [
        WebhookDeliveryRecord(
            id=id,
            endpoint_id=endpoint.id,
            event_id=number,
            elicitation_id=f"e-{id}",
            body="{}",
            status=status,
            attempts=0 if last is None else 1,
            next_attempt_at=NOW if status is DeliveryStatus.PENDING else None,
            claimed_by="replica-1" if status is DeliveryStatus.DELIVERING else None,
            lease_until=last if status is DeliveryStatus.DELIVERING else None,
            last_attempt_at=last,
            last_status_code=None,
            last_error=None,
            created_at=(last or NOW) - DAY,
            delivered_at=last if status is DeliveryStatus.DELIVERED else None,
        )
        for number, (id, status, last) in enumerate(deliveries, start=1)
    ]
    assert await into.webhooks.enqueue(records, from_cursor=cursor, to_cursor=cursor)
    async with into.transaction() as tx:
        for rec in records:
            if rec.last_attempt_at is not None:
                attempt = {"attempt": 1, "replica_id": "replica-1", "at": rec.last_attempt_at, "duration_ms": 5}
                await tx.execute(webhook_attempts.insert().values(delivery_id=rec.id, **attempt))


@pytest.mark.filterwarnings("ignore::service.core.audit_events.UnregisteredAuditEvent")  # made-up event names
async def test_retention_deletes_only_what_is_past_its_window(store: Store) -> None:  # noqa: F811
    # Elicitations: ended more than 30 days ago go (with their flows and verifications); ended recently or still
    # open (however old) stay. Three old ones with batches of two: the purge takes two batches.
    old_ended = [
        elicitation(status=status, updated_at=NOW - 31 * DAY)
        for status in (ElicitationStatus.COMPLETED, ElicitationStatus.EXPIRED, ElicitationStatus.FAILED)
    ]
    recent_ended = elicitation(status=ElicitationStatus.DECLINED, updated_at=NOW - 29 * DAY)
    old_open = elicitation(status=ElicitationStatus.AUTHORIZING, updated_at=NOW - 100 * DAY)
    for rec in [*old_ended, recent_ended, old_open]:
        await store.elicitations.insert(rec)
    await store.flows.insert(flow(old_ended[0].id))
    kept_flow = flow(recent_ended.id)
    await store.flows.insert(kept_flow)
    await store.verifications.insert(verification(old_ended[0].id, NOW - 40 * DAY))
    # Verifications: expired more than 7 days ago go, even when their elicitation stays.
    await store.verifications.insert(verification(recent_ended.id, NOW - 8 * DAY))
    kept_verification = verification(recent_ended.id, NOW - 6 * DAY)
    await store.verifications.insert(kept_verification)
    # Audit: a year; the event log: a week.
    await store.audit.record("old", now=NOW - 366 * DAY)
    await store.audit.record("recent", now=NOW - 364 * DAY)
    async with store.transaction() as tx:
        await store.outbox.append([_event("old-event")], at=NOW - 8 * DAY, conn=tx)
        await store.outbox.append([_event("recent-event")], at=NOW - 6 * DAY, conn=tx)
    # Grants are never purged, however old.
    ancient = grant(created_at=NOW - 1000 * DAY, updated_at=NOW - 1000 * DAY)
    await store.grants.upsert(ancient)
    # Webhook deliveries: delivered or failed more than 7 days ago go, with their attempts; one that ended recently
    # stays, and so does one not ended, however old (pending a retry, or an attempt whose lease ran out long ago).
    await seed_deliveries(
        store,
        ("old-delivered", DeliveryStatus.DELIVERED, NOW - 8 * DAY),
        ("old-failed", DeliveryStatus.FAILED, NOW - 9 * DAY),
        ("recent-failed", DeliveryStatus.FAILED, NOW - 6 * DAY),
        ("old-pending", DeliveryStatus.PENDING, NOW - 50 * DAY),
        ("never-tried", DeliveryStatus.PENDING, None),
        ("old-delivering", DeliveryStatus.DELIVERING, NOW - 40 * DAY),
    )

    expected = {
        PurgeKind.ELICITATIONS: 3,
        PurgeKind.VERIFICATIONS: 2,  # the 40-day-old one (also cascaded) and the 8-day-old one
        PurgeKind.AUDIT: 1,
        PurgeKind.EVENTS: 1,
        PurgeKind.WEBHOOK_DELIVERIES: 2,
    }
    assert await count_due(store.retention, POLICY, NOW) == expected  # a dry run deletes nothing
    assert await count_due(store.retention, POLICY, NOW) == expected

    deleted = await purge_due(store.retention, POLICY, NOW)

    assert deleted[PurgeKind.ELICITATIONS] == 3 and deleted[PurgeKind.AUDIT] == 1 and deleted[PurgeKind.EVENTS] == 1
    assert deleted[PurgeKind.WEBHOOK_DELIVERIES] == 2
    for rec in old_ended:
        assert await store.elicitations.get(rec.id) is None
    assert await store.elicitations.get(recent_ended.id) is not None
    assert await store.elicitations.get(old_open.id) is not None
    assert await _ids(store, oauth_flows) == {kept_flow.id}
    assert await _ids(store, identity_verifications) == {kept_verification.id}
    assert [e.event for e in await store.audit.list()] == ["recent"]
    assert [e.elicitation_id for e in await store.outbox.after(0)] == ["recent-event"]
    assert [g.id for g in await store.grants.find(ALICE, "github")] == [ancient.id]
    kept_deliveries = {"recent-failed", "old-pending", "never-tried", "old-delivering"}
    assert await _ids(store, webhook_deliveries) == kept_deliveries
    assert await _attempt_deliveries(store) == kept_deliveries - {"never-tried"}
    assert await count_due(store.retention, POLICY, NOW) == dict.fromkeys(expected, 0)


@pytest.mark.filterwarnings("ignore::service.core.audit_events.UnregisteredAuditEvent")  # made-up event names
async def test_a_window_of_zero_days_keeps_everything(store: Store) -> None:  # noqa: F811
    await store.elicitations.insert(elicitation(status=ElicitationStatus.COMPLETED, updated_at=NOW - 3000 * DAY))
    await store.audit.record("old", now=NOW - 3000 * DAY)
    await seed_deliveries(store, ("old-delivered", DeliveryStatus.DELIVERED, NOW - 3000 * DAY))
    keep_all = replace(
        POLICY, elicitation_days=0, verification_days=0, audit_days=0, event_days=0, webhook_delivery_days=0
    )

    assert await purge_due(store.retention, keep_all, NOW) == {}
    assert await _count(store, audit_events) == 1 and await _count(store, elicitation_events) == 0
    assert await _count(store, webhook_deliveries) == 1 and await _count(store, webhook_attempts) == 1


@pytest.mark.filterwarnings("ignore::service.core.audit_events.UnregisteredAuditEvent")  # made-up event names
async def test_purge_batches_are_bounded(store: Store) -> None:  # noqa: F811
    for n in range(5):
        await store.audit.record(f"old-{n}", now=NOW - 400 * DAY)

    deleted = await purge_due(store.retention, POLICY, NOW, max_batches=2)

    assert deleted[PurgeKind.AUDIT] == 4  # two batches of two; the rest waits for the next pass
    assert [e.event for e in await store.audit.list()] == ["old-4"]


def _event(elicitation_id: str) -> ElicitationEvent:
    return ElicitationEvent(elicitation_id, ElicitationStatus.COMPLETED, "conn-1")


async def _ids(on: Store, table) -> set[str]:  # type: ignore[no-untyped-def]
    async with on.db.reader.connect() as conn:
        return set((await conn.execute(select(table.c.id))).scalars())


async def _attempt_deliveries(on: Store) -> set[str]:
    async with on.db.reader.connect() as conn:
        return set((await conn.execute(select(webhook_attempts.c.delivery_id))).scalars())


async def _count(on: Store, table) -> int:  # type: ignore[no-untyped-def]
    async with on.db.reader.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


@pytest.mark.filterwarnings("ignore::service.core.audit_events.UnregisteredAuditEvent")  # made-up event names
def test_purge_command_counts_with_dry_run_then_deletes(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'connector.db'}"
    migrate(url)
    now = datetime.now(UTC)

    async def seed() -> None:
        seeded = Store.from_url(url)
        try:
            await seeded.audit.record("old", now=now - 400 * DAY)
            await seeded.audit.record("recent", now=now - DAY)
        finally:
            await seeded.close()

    async def audit_events_left() -> list[str]:
        reader = Store.from_url(url)
        try:
            return [e.event for e in await reader.audit.list()]
        finally:
            await reader.close()

    asyncio.run(seed())
    env = {"CONNECTOR_DATABASE__URL": url, "CONNECTOR_RETENTION__EVENT_DAYS": "0"}

    dry = cli("purge", "--dry-run", env=env)
    assert dry.code == 0, dry.err
    assert "audit_events: would delete 1 audit events older than 365 days (retention.audit_days)" in dry.out
    assert "elicitation_events: kept forever (retention.event_days = 0)" in dry.out
    assert (
        "webhook_deliveries: would delete 0 ended webhook deliveries (with their attempts) older than 7 days "
        "(retention.webhook_delivery_days)" in dry.out
    )
    assert "grants: never deleted by retention" in dry.out
    assert asyncio.run(audit_events_left()) == ["old", "recent"]

    done = cli("purge", env=env)
    assert done.code == 0, done.err
    assert "audit_events: deleted 1 audit events" in done.out
    assert asyncio.run(audit_events_left()) == ["recent"]


class _TimedRepo:
    """A retention repository whose batches take `per_row` seconds a row on a fake clock, until `slow_after` batches
    then `slow_per_row` (a machine getting busy), with `rows` old audit rows."""

    def __init__(self, rows: int, per_row: float, *, slow_after: int = 10**9, slow_per_row: float = 0.0) -> None:
        self.rows, self.per_row, self.slow_after, self.slow_per_row = rows, per_row, slow_after, slow_per_row
        self.now = 0.0
        self.batches: list[tuple[int, float]] = []  # (limit, seconds)

    def clock(self) -> float:
        return self.now

    async def count(self, kind: PurgeKind, before: datetime) -> int:
        return self.rows if kind is PurgeKind.AUDIT else 0

    async def purge(self, kind: PurgeKind, before: datetime, *, limit: int) -> int:
        if kind is not PurgeKind.AUDIT:
            return 0
        removed = min(limit, self.rows)
        self.rows -= removed
        per_row = self.per_row if len(self.batches) < self.slow_after else self.slow_per_row
        self.batches.append((limit, per_row * limit))
        self.now += per_row * limit
        return removed


async def test_purge_batches_follow_their_measured_time() -> None:
    policy = RetentionPolicy(batch_size=500, batch_target_seconds=0.03)
    rests: list[float] = []

    async def rest(seconds: float) -> None:
        rests.append(seconds)

    # 1 ms a row: the first batch (50 rows, 50 ms) is too slow; the next ones are cut to the target and stay there.
    slow = _TimedRepo(5_000, 0.001)
    deleted = await purge_due(slow, policy, NOW, clock=slow.clock, rest=rest)
    assert deleted[PurgeKind.AUDIT] == 5_000
    assert slow.batches[0] == (50, 0.05)
    assert all(limit <= 30 and seconds <= 0.03 for limit, seconds in slow.batches[1:])
    assert rests == pytest.approx(
        [seconds for _, seconds in slow.batches[:-1]]
    )  # a rest as long as each batch, but the last

    # Fast rows: batches grow to the most the policy allows. Then the machine gets busy, and batches shrink to fit.
    busy = _TimedRepo(20_000, 0.00001, slow_after=10, slow_per_row=0.0003)
    deleted = await purge_due(busy, policy, NOW, clock=busy.clock, rest=rest)
    assert deleted[PurgeKind.AUDIT] == 20_000
    assert [limit for limit, _ in busy.batches[:6]] == [50, 100, 200, 400, 500, 500]
    assert all(seconds <= 0.03 for _, seconds in busy.batches[11:])
    assert max(limit for limit, _ in busy.batches) <= 500


async def test_purge_batches_grow_back_when_fast_again() -> None:
    policy = RetentionPolicy(batch_size=500, batch_target_seconds=0.03)
    repo = _TimedRepo(20_000, 0.001, slow_after=3, slow_per_row=0.00001)  # slow, then fast

    async def rest(seconds: float) -> None:
        pass

    await purge_due(repo, policy, NOW, clock=repo.clock, rest=rest)
    limits = [limit for limit, _ in repo.batches]
    assert limits[1] == 30 and limits[-2] == 500  # cut, then back up to the policy's most


async def test_purge_batches_with_a_fixed_cost_grow_to_the_target() -> None:
    """A batch costs a round trip whatever its size (here 20 ms, two thirds of the target): batches still grow until
    they take about the target, not stay at the first size."""
    policy = RetentionPolicy(batch_size=500, batch_target_seconds=0.03)
    repo = _TimedRepo(20_000, 0.0001)
    fixed = 0.02
    purge = repo.purge

    async def with_round_trip(kind: PurgeKind, before: datetime, *, limit: int) -> int:
        repo.now += fixed
        return await purge(kind, before, limit=limit)

    repo.purge = with_round_trip  # type: ignore[method-assign]

    async def rest(seconds: float) -> None:
        pass

    await purge_due(repo, policy, NOW, clock=repo.clock, rest=rest)
    limits = [limit for limit, _ in repo.batches]
    assert limits[0] == 50 and max(limits[5:]) > 60  # grown: 100 rows take 30 ms
    assert all(fixed + seconds <= 0.04 for _, seconds in repo.batches[1:])
