"""A step's statement against another change of the same elicitation or account, on SQLite and PostgreSQL: the first
transaction takes its step and stays open while the second runs its own (PostgreSQL: it waits for the first's row or
key; SQLite: for the writer), then commits. The second's conditions fail as they would after the commit, and the step
writes nothing of what goes with it (no flow, no ending, no audit row, no copy left on the elicitation; a first
grant only as the design says: kept when the user authorized an elicitation ended meanwhile)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.events import ElicitationEvent
from service.core.records import AuditEntry, ElicitationRecord, GrantRecord
from service.core.states import START_FROM, ElicitationStatus
from service.store import Store
from service.store.tables import grants, oauth_flows

from .test_audit_dialects import carried_copies
from .test_store import NOW, elicitation, flow, store  # noqa: F401 - `store`: the fixture, on both databases
from .test_store import grant as a_grant

Step = Callable[[AsyncConnection], Awaitable[Any]]
COMPLETED = ElicitationStatus.COMPLETED


async def overlapped(in_store: Store, first: Step, second: Step) -> tuple[Any, Any]:
    """`first` in a transaction held open until `second`, in another, has had time to reach its statement; both
    results. The second is held to finish after the first's commit (it waited for it)."""
    stepped, order = asyncio.Event(), []

    async def one() -> Any:
        async with in_store.transaction() as tx:
            result = await first(tx)
            stepped.set()
            await asyncio.sleep(0.3)
        order.append("first committed")
        return result

    async def two() -> Any:
        await stepped.wait()
        async with in_store.transaction() as tx:
            result = await second(tx)
        order.append("second committed")
        return result

    results = await asyncio.gather(one(), two())
    assert order == ["first committed", "second committed"]
    return results


def entry(event: str, rec: ElicitationRecord) -> AuditEntry:
    return AuditEntry(event, NOW, rec.id, rec.identity, rec.provider)


async def authorizing(in_store: Store, rec: ElicitationRecord) -> None:
    await in_store.elicitations.insert(rec)
    assert await in_store.elicitations.transition(rec.id, ElicitationStatus.AUTHORIZING, now=NOW, from_=START_FROM)


def completion(in_store: Store, rec: ElicitationRecord, given: GrantRecord) -> Step:
    """The callback's completion with a user's first grant (`Lifecycle.finish` with `first_grant`)."""
    ending = ElicitationEvent(rec.id, COMPLETED, rec.connection_key)

    async def complete(tx: AsyncConnection) -> Any:
        return await in_store.elicitations.end_with_first_grant(
            rec.id, COMPLETED, ending, given, now=NOW, conn=tx, audit=entry("completed", rec), last=True
        )

    return complete


async def written(in_store: Store) -> dict[str, Any]:
    """What the steps wrote: audit events and endings per elicitation, grants and flows by id, copies left."""
    async with in_store.db.reader.connect() as conn:
        grant_ids = (await conn.execute(select(grants.c.id).order_by(grants.c.id))).scalars().all()
        flow_ids = (await conn.execute(select(oauth_flows.c.id).order_by(oauth_flows.c.id))).scalars().all()
    logged = await in_store.outbox.after(0)
    endings = [(e.elicitation_id, e.status.value) for e in logged if isinstance(e, ElicitationEvent)]
    assert len(endings) == len(logged)  # no grant event in these steps
    return {
        "audit": sorted((a.elicitation_id, a.event) for a in await in_store.audit.list()),
        "endings": sorted(endings),
        "grants": sorted(grant_ids),
        "flows": sorted(flow_ids),
        "copies": await carried_copies(in_store),
    }


async def test_two_first_grants_of_one_account_store_one_and_end_one(store: Store) -> None:  # noqa: F811
    """Two elicitations of one user, each completing with the account's first grant (two tabs): the second finds
    the account holding the first's grant, so neither its grant nor its ending goes in (its caller then replaces the
    grant as an account's grant given again)."""
    one, other = elicitation(), elicitation()
    for rec in (one, other):
        await authorizing(store, rec)
    first, second = a_grant(), a_grant(scopes=("repo",))
    results = await overlapped(store, completion(store, one, first), completion(store, other, second))
    assert results[0][0] and results[0][1] is not None and results[1] == (False, None)
    assert await written(store) == {
        "audit": [(one.id, "completed")],
        "endings": [(one.id, COMPLETED.value)],
        "grants": [first.id],
        "flows": [],
        "copies": [],
    }
    assert await store.grants.get(first.id) == first
    assert (await store.elicitations.get(other.id)) == replace(other, status=ElicitationStatus.AUTHORIZING)


async def test_two_completions_of_one_elicitation_complete_it_once(store: Store) -> None:  # noqa: F811
    """Two callbacks of one elicitation (two flows started in two tabs): one completion, one ending; the second's
    grant of the same account does not go in, one of another account does (the user authorized it) without a
    second ending."""
    rec = elicitation()
    await authorizing(store, rec)
    first, same_account, other_account = a_grant(), a_grant(scopes=("repo",)), a_grant(account="2002")
    results = await overlapped(store, completion(store, rec, first), completion(store, rec, same_account))
    assert results[1] == (False, None)
    async with store.transaction() as tx:
        assert await completion(store, rec, other_account)(tx) == (True, None)
    assert await written(store) == {
        "audit": [(rec.id, "completed")],
        "endings": [(rec.id, COMPLETED.value)],
        "grants": sorted([first.id, other_account.id]),
        "flows": [],
        "copies": [],
    }


async def test_a_completion_against_the_sweepers_expiry_ends_the_elicitation_once(store: Store) -> None:  # noqa: F811
    """The sweeper expires an elicitation whose callback completes it at the same moment, in both orders: one
    ending, the winner's; after the expiry the user's grant is kept but the elicitation stays expired."""
    due = NOW + timedelta(minutes=1)
    expiring_first = elicitation(expires_at=NOW)
    await authorizing(store, expiring_first)

    def expiry() -> Step:
        async def expire(tx: AsyncConnection) -> list[str]:
            expired = await store.elicitations.expire_due(due, conn=tx)
            ending = [ElicitationEvent(r.id, ElicitationStatus.EXPIRED, r.connection_key) for r in expired]
            await store.outbox.append(ending, at=due, conn=tx)
            return [r.id for r in expired]

        return expire

    kept = a_grant()
    expired, completed = await overlapped(store, expiry(), completion(store, expiring_first, kept))
    assert expired == [expiring_first.id] and completed == (True, None)

    # The other order, on a fresh elicitation of another user.
    late = elicitation(expires_at=NOW, identity=replace(kept.identity, subject="bob"))
    await authorizing(store, late)
    bobs = a_grant(identity=late.identity)
    completed, expired = await overlapped(store, completion(store, late, bobs), expiry())
    assert completed[0] and completed[1] is not None and expired == []

    assert await written(store) == {
        "audit": [(late.id, "completed")],
        "endings": sorted([(expiring_first.id, ElicitationStatus.EXPIRED.value), (late.id, COMPLETED.value)]),
        "grants": sorted([kept.id, bobs.id]),
        "flows": [],
        "copies": [],
    }
    assert (await store.elicitations.get(expiring_first.id)).status is ElicitationStatus.EXPIRED  # type: ignore[union-attr]


async def test_continue_twice_starts_one_flow_with_the_first_start(store: Store) -> None:  # noqa: F811
    """Continue in two tabs: the first start moves the elicitation and writes its flow; the second's first-start
    statement then matches nothing and writes no flow and no audit row (the browser restarts it then)."""
    rec = elicitation()
    await store.elicitations.insert(rec)
    flows = [flow(rec.id), flow(rec.id)]

    def start(started: Any) -> Step:
        async def go(tx: AsyncConnection) -> Any:
            return await store.elicitations.transition(
                rec.id,
                ElicitationStatus.AUTHORIZING,
                now=NOW,
                from_=START_FROM,
                conn=tx,
                audit=entry("verified", rec),
                flow=started,
                last=True,
            )

        return go

    moved, again = await overlapped(store, start(flows[0]), start(flows[1]))
    assert moved is not None and moved.status is ElicitationStatus.AUTHORIZING and again is None
    assert await written(store) == {
        "audit": [(rec.id, "verified")],
        "endings": [],
        "grants": [],
        "flows": [flows[0].id],
        "copies": [],
    }
