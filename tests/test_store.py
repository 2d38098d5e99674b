"""Store behaviour on SQLite and PostgreSQL: round-trips, transitions, single-use flows, grant upserts."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, StatementError

from service import Identity
from service.core.health import GrantHealth
from service.core.records import ElicitationRecord, FlowRecord, GrantRecord
from service.core.states import ALLOWED, RESTART_FROM, START_FROM, TERMINAL, ElicitationStatus, can_transition
from service.store import Store, display_url, migrate
from service.store.elicitations import predecessors
from service.store.tables import elicitations

from .conftest import fresh_postgres_database

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ALICE = Identity("https://issuer.example", "alice")
BOB = Identity("https://issuer.example", "bob")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'db' / 'connector.db'}"
        migrate(url)
        store = Store.from_url(url)
        yield store
        await store.close()
        return
    async with fresh_postgres_database(migrated=True) as url:
        store = Store.from_url(url)
        try:
            yield store
        finally:
            await store.close()


def elicitation(
    id: str | None = None,
    *,
    status: ElicitationStatus = ElicitationStatus.PENDING,
    expires_at: datetime = NOW + timedelta(minutes=10),
    **changes: object,
) -> ElicitationRecord:
    rec = ElicitationRecord(
        id=id or uuid.uuid4().hex,
        connection_key="conn-1",
        identity=ALICE,
        provider="github",
        scopes=("repo", "read:user"),
        scope_kind="session",
        session_id="sess-1",
        tool_call_id="call-1",
        request_id=7,
        agent_name="Test agent",
        message="Connect GitHub",
        status=status,
        failure_reason=None,
        created_at=NOW,
        expires_at=expires_at,
        updated_at=NOW,
    )
    return replace(rec, **changes)  # type: ignore[arg-type]


def flow(elicitation_id: str, *, state_hash: str | None = None, expires_at: datetime | None = None) -> FlowRecord:
    return FlowRecord(
        id=uuid.uuid4().hex,
        elicitation_id=elicitation_id,
        state_hash=state_hash or uuid.uuid4().hex,
        verifier_key_id="k1",
        verifier_ciphertext=b"\x00\x01verifier-ciphertext",
        nonce="nonce-1",
        expected_issuer="https://github.com",
        browser_binding_hash="binding",
        redirect_uri="http://127.0.0.1:8700/callback",
        created_at=NOW,
        expires_at=expires_at or NOW + timedelta(minutes=10),
        used_at=None,
    )


def grant(identity: Identity = ALICE, account: str = "1001", **changes: object) -> GrantRecord:
    rec = GrantRecord(
        id=uuid.uuid4().hex,
        identity=identity,
        provider="github",
        provider_account_id=account,
        scopes=("read:user",),
        token_key_id="k1",
        token_ciphertext=b"\xffciphertext-1",
        token_expires_at=NOW + timedelta(hours=1),
        created_at=NOW,
        updated_at=NOW,
    )
    return replace(rec, **changes)  # type: ignore[arg-type]


# -- elicitations ----------------------------------------------------------------------------------


async def test_elicitation_round_trips_every_field(store: Store) -> None:
    by_int = elicitation(request_id=7)
    by_str = elicitation(request_id="7", scope_kind="request", session_id=None, tool_call_id=None)
    by_none = elicitation(request_id=None, scopes=())
    for rec in (by_int, by_str, by_none):
        await store.elicitations.insert(rec)
        assert await store.elicitations.get(rec.id) == rec

    got = await store.elicitations.get(by_int.id)
    assert got is not None and got.request_id == 7 and isinstance(got.request_id, int)
    got = await store.elicitations.get(by_str.id)
    assert got is not None and got.request_id == "7"
    assert await store.elicitations.get("no-such-id") is None


async def test_datetimes_are_stored_as_utc_and_read_back_aware(store: Store) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2026, 12, 2, 14, 0, tzinfo=plus_two)  # the same instant as NOW
    rec = elicitation(created_at=local, expires_at=local + timedelta(minutes=1), updated_at=local)
    await store.elicitations.insert(rec)

    got = await store.elicitations.get(rec.id)
    assert got is not None
    assert got.created_at == NOW and got.created_at.tzinfo == UTC
    assert got.expires_at.utcoffset() == timedelta(0)
    # Comparisons in SQL use the UTC value: due one minute after NOW, whatever offset it was written with.
    assert await store.elicitations.expire_due(NOW) == []
    assert [r.id for r in await store.elicitations.expire_due(NOW + timedelta(minutes=1))] == [rec.id]


async def test_naive_datetimes_are_refused(store: Store) -> None:
    with pytest.raises(StatementError, match="naive datetime"):
        await store.elicitations.insert(elicitation(created_at=datetime(2026, 12, 2, 12, 0)))


def test_the_provider_step_starts_by_allowed_transitions_only() -> None:
    # START_FROM -> VERIFIED -> AUTHORIZING and RESTART_FROM -> AUTHORIZING are written as one UPDATE each.
    assert all(can_transition(s, ElicitationStatus.VERIFIED) for s in START_FROM)
    assert can_transition(ElicitationStatus.VERIFIED, ElicitationStatus.AUTHORIZING)
    assert all(can_transition(s, ElicitationStatus.AUTHORIZING) for s in RESTART_FROM)
    assert not (START_FROM & RESTART_FROM) and not any(s.terminal for s in START_FROM | RESTART_FROM)


def test_no_terminal_status_is_a_predecessor() -> None:
    for target in ElicitationStatus:
        assert not (predecessors(target) & TERMINAL)
    assert predecessors(ElicitationStatus.EXPIRED) == set(ElicitationStatus) - TERMINAL


async def test_transition_follows_allowed_for_every_pair(store: Store) -> None:
    later = NOW + timedelta(seconds=5)
    for current in ElicitationStatus:
        for target in ElicitationStatus:
            rec = elicitation(status=current)
            await store.elicitations.insert(rec)
            result = await store.elicitations.transition(rec.id, target, now=later)
            stored = await store.elicitations.get(rec.id)
            assert stored is not None
            if can_transition(current, target):
                assert result == stored, (current, target)
                assert stored.status == target and stored.updated_at == later, (current, target)
            else:
                assert result is None, (current, target)
                assert stored == rec, (current, target)
    # Sanity: the table above is not vacuous.
    assert any(ALLOWED.values()) and TERMINAL


async def test_terminal_status_never_changes(store: Store) -> None:
    rec = elicitation()
    await store.elicitations.insert(rec)
    path = [ElicitationStatus.CONSENTED, ElicitationStatus.VERIFIED, ElicitationStatus.AUTHORIZING]
    for status in [*path, ElicitationStatus.COMPLETED]:
        moved = await store.elicitations.transition(rec.id, status, now=NOW)
        assert moved is not None and moved.status == status

    for target in ElicitationStatus:
        assert await store.elicitations.transition(rec.id, target, reason="late", now=NOW) is None
    assert await store.elicitations.expire_due(NOW + timedelta(days=1)) == []
    final = await store.elicitations.get(rec.id)
    assert final is not None
    assert final.status == ElicitationStatus.COMPLETED and final.failure_reason is None


async def test_transition_stores_the_reason_and_ignores_unknown_ids(store: Store) -> None:
    rec = elicitation(status=ElicitationStatus.AUTHORIZING)
    await store.elicitations.insert(rec)
    failed = await store.elicitations.transition(rec.id, ElicitationStatus.FAILED, reason="provider_error", now=NOW)
    assert failed is not None
    assert failed.status == ElicitationStatus.FAILED and failed.failure_reason == "provider_error"
    assert await store.elicitations.transition("missing", ElicitationStatus.CANCELLED, now=NOW) is None


async def test_expire_due_expires_only_open_elicitations_that_are_due(store: Store) -> None:
    due_pending = elicitation(expires_at=NOW - timedelta(seconds=1))
    due_at_now = elicitation(status=ElicitationStatus.AUTHORIZING, expires_at=NOW)
    not_due = elicitation(expires_at=NOW + timedelta(seconds=1))
    finished = elicitation(status=ElicitationStatus.COMPLETED, expires_at=NOW - timedelta(hours=1))
    cancelled = elicitation(status=ElicitationStatus.CANCELLED, expires_at=NOW - timedelta(hours=1))
    for rec in (due_pending, due_at_now, not_due, finished, cancelled):
        await store.elicitations.insert(rec)

    expired = await store.elicitations.expire_due(NOW, reason="expired before completion")

    assert [r.id for r in expired] == sorted([due_pending.id, due_at_now.id])
    assert {(r.status, r.failure_reason) for r in expired} == {(ElicitationStatus.EXPIRED, "expired before completion")}
    statuses = {}
    for rec in (due_pending, due_at_now, not_due, finished, cancelled):
        stored = await store.elicitations.get(rec.id)
        assert stored is not None
        statuses[rec.id] = stored.status
    assert statuses == {
        due_pending.id: ElicitationStatus.EXPIRED,
        due_at_now.id: ElicitationStatus.EXPIRED,
        not_due.id: ElicitationStatus.PENDING,
        finished.id: ElicitationStatus.COMPLETED,
        cancelled.id: ElicitationStatus.CANCELLED,
    }
    assert await store.elicitations.expire_due(NOW) == []


# -- flows -----------------------------------------------------------------------------------------


async def test_flow_round_trips_and_is_claimed_once(store: Store) -> None:
    parent = elicitation()
    await store.elicitations.insert(parent)
    rec = flow(parent.id)
    bare = replace(flow(parent.id), verifier_key_id=None, verifier_ciphertext=None, nonce=None, expected_issuer=None)
    await store.flows.insert(rec)
    await store.flows.insert(bare)
    assert await store.flows.get_by_state_hash(rec.state_hash) == rec
    assert await store.flows.get_by_state_hash(bare.state_hash) == bare
    assert await store.flows.get_by_state_hash("unknown") is None

    claimed = await store.flows.claim(rec.state_hash, NOW)
    assert claimed == replace(rec, used_at=NOW)
    assert await store.flows.claim(rec.state_hash, NOW) is None
    assert await store.flows.claim(rec.state_hash, NOW + timedelta(seconds=1)) is None
    assert await store.flows.claim("unknown", NOW) is None
    stored = await store.flows.get_by_state_hash(rec.state_hash)
    assert stored is not None and stored.used_at == NOW


async def test_expired_flow_cannot_be_claimed(store: Store) -> None:
    parent = elicitation()
    await store.elicitations.insert(parent)
    expired = flow(parent.id, expires_at=NOW - timedelta(seconds=1))
    at_deadline = flow(parent.id, expires_at=NOW)
    for rec in (expired, at_deadline):
        await store.flows.insert(rec)
        assert await store.flows.claim(rec.state_hash, NOW) is None
        stored = await store.flows.get_by_state_hash(rec.state_hash)
        assert stored is not None and stored.used_at is None


async def test_state_hash_is_unique(store: Store) -> None:
    parent = elicitation()
    await store.elicitations.insert(parent)
    await store.flows.insert(flow(parent.id, state_hash="same"))
    with pytest.raises(IntegrityError):
        await store.flows.insert(flow(parent.id, state_hash="same"))


async def test_flow_needs_an_existing_elicitation(store: Store) -> None:
    with pytest.raises(IntegrityError):
        await store.flows.insert(flow("no-such-elicitation"))


async def test_concurrent_claimers_get_the_flow_exactly_once(store: Store) -> None:
    parent = elicitation()
    await store.elicitations.insert(parent)
    rec = flow(parent.id)
    await store.flows.insert(rec)

    results = await asyncio.gather(*(store.flows.claim(rec.state_hash, NOW) for _ in range(8)))

    assert [r for r in results if r is not None] == [replace(rec, used_at=NOW)]


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
async def test_second_claimer_waits_for_the_first_transaction(store: Store, first_commits: bool) -> None:
    parent = elicitation()
    await store.elicitations.insert(parent)
    rec = flow(parent.id)
    await store.flows.insert(rec)

    async with store.engine.connect() as first:
        transaction = await first.begin()
        assert await store.flows.claim(rec.state_hash, NOW, conn=first) is not None
        second = asyncio.create_task(store.flows.claim(rec.state_hash, NOW))
        await asyncio.sleep(0.3)
        # The second claim must wait for the first transaction instead of claiming the same flow.
        assert not second.done()
        await (transaction.commit() if first_commits else transaction.rollback())
    # On SQLite the second claimer waits for the one writing connection, so it goes on once `first` is returned.
    result = await asyncio.wait_for(second, timeout=10)

    if first_commits:
        assert result is None
    else:
        assert result == replace(rec, used_at=NOW)


async def test_invalidate_open_uses_up_only_that_elicitations_unused_flows(store: Store) -> None:
    mine, other = elicitation(), elicitation()
    await store.elicitations.insert(mine)
    await store.elicitations.insert(other)
    used, open_a, open_b, others = flow(mine.id), flow(mine.id), flow(mine.id), flow(other.id)
    for rec in (used, open_a, open_b, others):
        await store.flows.insert(rec)
    assert await store.flows.claim(used.state_hash, NOW) is not None

    later = NOW + timedelta(minutes=1)
    assert await store.flows.invalidate_open(mine.id, later) == 2

    for rec in (open_a, open_b):
        assert await store.flows.claim(rec.state_hash, later) is None
        stored = await store.flows.get_by_state_hash(rec.state_hash)
        assert stored is not None and stored.used_at == later
    stored = await store.flows.get_by_state_hash(used.state_hash)
    assert stored is not None and stored.used_at == NOW  # already-used flows keep their time
    assert await store.flows.claim(others.state_hash, later) is not None
    assert await store.flows.invalidate_open(mine.id, later) == 0


# -- grants ----------------------------------------------------------------------------------------


async def test_grant_upsert_inserts_then_replaces_keeping_id_and_created_at(store: Store) -> None:
    first = grant()
    assert await store.grants.upsert(first) == first

    later = NOW + timedelta(hours=2)
    again = grant(
        id="a-different-id",
        scopes=("read:user", "repo"),
        token_key_id="k2",
        token_ciphertext=b"ciphertext-2",
        token_expires_at=None,
        created_at=later,
        updated_at=later,
    )
    stored = await store.grants.upsert(again)

    assert stored == replace(again, id=first.id, created_at=NOW)
    assert await store.grants.get(first.id) == stored
    assert await store.grants.get("a-different-id") is None
    assert await store.grants.find(ALICE, "github") == [stored]


async def test_grants_are_separate_per_account_identity_and_provider(store: Store) -> None:
    old = grant(account="1001")
    new = grant(account="2002", updated_at=NOW + timedelta(minutes=5))
    bobs = grant(identity=BOB, account="1001")
    gitlab = grant(account="1001", provider="gitlab")
    for rec in (old, new, bobs, gitlab):
        await store.grants.upsert(rec)

    assert await store.grants.find(ALICE, "github") == [new, old]  # most recently updated first
    assert await store.grants.find(BOB, "github") == [bobs]
    assert await store.grants.find(ALICE, "gitlab") == [gitlab]
    assert await store.grants.find(Identity("https://other.example", "alice"), "github") == []


async def test_grant_update_tokens_and_delete(store: Store) -> None:
    rec = grant()
    await store.grants.upsert(rec)
    later = NOW + timedelta(hours=1)
    await store.grants.update_tokens(
        rec.id,
        token_key_id="k2",
        token_ciphertext=b"refreshed",
        token_expires_at=later + timedelta(hours=1),
        scopes=("read:user", "gist"),
        now=later,
        replacing=rec.token_ciphertext,
    )
    # Only over the set it was read with: a refresh that started from an older set stores nothing.
    assert not await store.grants.update_tokens(
        rec.id,
        token_key_id="k1",
        token_ciphertext=b"older",
        token_expires_at=later,
        scopes=("read:user",),
        now=later,
        replacing=rec.token_ciphertext,
    )
    assert await store.grants.get(rec.id) == replace(
        rec,
        token_key_id="k2",
        token_ciphertext=b"refreshed",
        token_expires_at=later + timedelta(hours=1),
        scopes=("read:user", "gist"),
        updated_at=later,
        health=GrantHealth(last_refresh_at=later),
    )

    assert await store.grants.delete(rec.id) is True
    assert await store.grants.get(rec.id) is None
    assert await store.grants.delete(rec.id) is False


def test_token_ciphertext_is_not_in_the_repr() -> None:
    assert "ciphertext-1" not in repr(grant())
    assert "verifier-ciphertext" not in repr(flow("e"))


# -- audit -----------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::service.core.audit_events.UnregisteredAuditEvent")  # made-up event names
async def test_audit_records_are_listed_oldest_first_and_filtered(store: Store) -> None:
    await store.audit.record("elicitation.created", elicitation_id="e1", identity=ALICE, provider="github", now=NOW)
    await store.audit.record("elicitation.completed", elicitation_id="e1", detail={"scopes": ["repo"], "n": 1})
    await store.audit.record("elicitation.created", elicitation_id="e2", now=NOW + timedelta(seconds=1))

    every = await store.audit.list()
    assert [(r.event, r.elicitation_id) for r in every] == [
        ("elicitation.created", "e1"),
        ("elicitation.completed", "e1"),
        ("elicitation.created", "e2"),
    ]
    first, second, _ = every
    assert first.identity == ALICE and first.provider == "github" and first.detail == {} and first.at == NOW
    assert second.identity is None and second.detail == {"scopes": ["repo"], "n": 1}
    assert second.at.tzinfo == UTC and abs(datetime.now(UTC) - second.at) < timedelta(minutes=1)

    assert [r.event for r in await store.audit.list(elicitation_id="e1")] == [
        "elicitation.created",
        "elicitation.completed",
    ]
    assert [r.elicitation_id for r in await store.audit.list(event="elicitation.created")] == ["e1", "e2"]
    assert await store.audit.list(elicitation_id="e2", event="elicitation.completed") == []


# -- transactions and the store --------------------------------------------------------------------


async def test_transaction_commits_together_or_not_at_all(store: Store) -> None:
    kept, lost = elicitation(), elicitation()
    async with store.transaction() as conn:
        await store.elicitations.insert(kept, conn=conn)
        await store.flows.insert(flow(kept.id), conn=conn)
        await store.audit.record("created", elicitation_id=kept.id, conn=conn)

    with pytest.raises(RuntimeError, match="boom"):
        async with store.transaction() as conn:
            await store.elicitations.insert(lost, conn=conn)
            await store.audit.record("created", elicitation_id=lost.id, conn=conn)
            raise RuntimeError("boom")

    assert await store.elicitations.get(kept.id) == kept
    assert await store.elicitations.get(lost.id) is None
    assert [r.elicitation_id for r in await store.audit.list()] == [kept.id]


async def test_a_transaction_cancelled_mid_statement_raises_cancelled_error(store: Store) -> None:
    """A task cancelled while its statement waits keeps its CancelledError (nothing replaces it) and writes nothing."""
    parent = elicitation()
    await store.elicitations.insert(parent)
    rec = flow(parent.id)
    await store.flows.insert(rec)
    written = elicitation()

    async def claim_in_a_transaction() -> None:
        async with store.transaction() as conn:
            await store.elicitations.insert(written, conn=conn)
            await store.audit.record("created", elicitation_id=written.id, conn=conn)
            await store.flows.claim(rec.state_hash, NOW, conn=conn)  # waits for the lock held below

    async with store.engine.connect() as first:
        transaction = await first.begin()
        assert await store.flows.claim(rec.state_hash, NOW, conn=first) is not None
        second = asyncio.create_task(claim_in_a_transaction())
        await asyncio.sleep(0.3)  # let the second claim block on the lock
        assert not second.done()
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        await transaction.rollback()

    assert await store.elicitations.get(written.id) is None
    assert [r.elicitation_id for r in await store.audit.list()] == []
    async with store.transaction() as conn:  # the pool still hands out working connections
        await store.elicitations.insert(written, conn=conn)
    assert await store.elicitations.get(written.id) == written


async def test_repository_calls_inside_a_transaction_see_its_writes(store: Store) -> None:
    rec = elicitation()
    async with store.transaction() as conn:
        await store.elicitations.insert(rec, conn=conn)
        moved = await store.elicitations.transition(rec.id, ElicitationStatus.CONSENTED, now=NOW, conn=conn)
        assert moved is not None
        rows = (await conn.execute(select(elicitations.c.status))).scalars().all()
        assert rows == ["consented"]


async def test_ping_and_check_schema_pass_on_a_migrated_database(store: Store) -> None:
    await store.ping()
    await store.check_schema()


# -- engine ----------------------------------------------------------------------------------------


async def test_sqlite_connections_use_wal_foreign_keys_busy_timeout_and_a_small_page_cache(tmp_path: Path) -> None:
    db = tmp_path / "nested" / "dir" / "connector.db"
    store = Store.from_url(f"sqlite+aiosqlite:///{db}")
    try:
        assert db.parent.is_dir()  # created by create_engine
        # Two connections at once: each gets the pragmas, not only the first.
        async with store.db.reader.connect() as one, store.db.reader.connect() as two:
            for conn in (one, two):
                assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
                assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
                assert (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar() == 5000
                # A page cache per connection that fills as the file grows: bounded well below SQLite's 2 MB.
                assert (await conn.exec_driver_sql("PRAGMA cache_size")).scalar() == -256
    finally:
        await store.close()


def test_display_url_and_repr_drop_the_password() -> None:
    url = "postgresql+asyncpg://app:s3cret-pw@db.internal:5432/connector?ssl=require"
    assert display_url(url) == "postgresql+asyncpg://app@db.internal:5432/connector?ssl=require"
    store = Store.from_url(url)  # no connection is made
    assert "s3cret-pw" not in repr(store)
    assert display_url("sqlite+aiosqlite:///./var/connector.db") == "sqlite+aiosqlite:///./var/connector.db"
