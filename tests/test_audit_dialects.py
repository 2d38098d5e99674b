"""The audit trail and the event log are the same on SQLite and PostgreSQL, field by field (ids and times aside):
PostgreSQL writes a step's rows in its statement's CTEs, SQLite through the triggers that copy the step's note
(migration 0020, `service.store.step_writes`). The same flows run on both: connect flows (a first grant, then asked
again), a page opened after its flow ended, declines and cancellations by the client, the browser and the agent,
and a user whose name must be escaped in the audit row."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select

from service import ElicitationStatus, Identity
from service.core.events import ElicitationEvent
from service.core.records import AuditEntry
from service.core.states import CompletionDelivery
from service.store import Store
from service.store.tables import audit_events, elicitation_events, elicitations
from service.testing import ScriptedBrowser
from service.web.server import listening_socket

from .conftest import Deploy, Deployment, deploy, fresh_postgres_database
from .flow_support import Pending, asking, status_of
from .test_store import NOW, elicitation, store  # noqa: F401 - `store`: the fixture, on both databases

Trail = dict[str, list[tuple[Any, ...]]]


async def wait_for(condition: Callable[[], Any], what: str) -> None:
    async with asyncio.timeout(10):
        while not await condition():  # noqa: ASYNC110 - a state in the database
            await asyncio.sleep(0.02)


async def reaches(deployment: Deployment, pending: Pending, status: ElicitationStatus) -> None:
    async def reached() -> bool:
        return await status_of(deployment, pending.elicitation_id) is status

    await wait_for(reached, status.value)


async def run_flows(deployment: Deployment) -> list[str]:
    """Every flow of the module, one after the other; their elicitation ids in order."""
    ids: list[str] = []
    connector_store = deployment.connector.runtime.store
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        for scope in ("first", "again"):  # a user's first grant at the provider, then the same grant asked again
            pending = await ask(scopes=(scope,))
            ids.append(pending.elicitation_id)
            await reaches(deployment, pending, ElicitationStatus.CONSENTED)  # else the browser may be ahead of it
            assert (await browser.authorize(pending.url)).status_code == 200
            assert (await pending.outcome()).ok

            async def told(elicitation_id: str = pending.elicitation_id) -> bool:
                return "completion_sent" in [
                    a.event for a in await connector_store.audit.list(elicitation_id=elicitation_id)
                ]

            await wait_for(told, "completion_sent")
        assert (await browser.get(pending.url)).status_code == 409  # opened after it ended: no `opened`

        for answer in ("decline", "cancel"):  # the client answers the elicitation
            pending = await ask(answer=answer)
            ids.append(pending.elicitation_id)
            await pending.outcome()

        pending = await ask()  # the browser declines on the consent page
        ids.append(pending.elicitation_id)
        await reaches(deployment, pending, ElicitationStatus.CONSENTED)
        await browser.submit(await browser.get(pending.url), "decline")
        await reaches(deployment, pending, ElicitationStatus.DECLINED)

        pending = await ask()  # the agent stops waiting after the page was opened
        ids.append(pending.elicitation_id)
        await reaches(deployment, pending, ElicitationStatus.CONSENTED)
        assert (await browser.get(pending.url)).status_code == 200
        pending.task.cancel()
        await reaches(deployment, pending, ElicitationStatus.CANCELLED)

        # Bound to a user whose subject has a control character: the audit rows hold it escaped, and the consent
        # page's `opened` is not copied from the row but written as its own statement (on both databases).
        odd = Identity(deployment.local_user.issuer, "mallory\x01")
        pending = await ask(user=odd)
        ids.append(pending.elicitation_id)
        await reaches(deployment, pending, ElicitationStatus.CONSENTED)
        refused = await browser.submit(await browser.get(pending.url), "continue")
        assert refused.headers["x-connector-error"] == "identity_mismatch"
    return ids


async def trail(deployment: Deployment, ids: list[str]) -> Trail:
    """The audit and event-log rows of the elicitations `ids`, each named by its place in `ids`; the times checked
    against the elicitation's and left out."""
    connector_store = deployment.connector.runtime.store
    place = {elicitation_id: f"elicitation-{n}" for n, elicitation_id in enumerate(ids)}
    async with connector_store.db.reader.connect() as conn:
        audited = (await conn.execute(select(audit_events).order_by(audit_events.c.id))).mappings().all()
        logged = (await conn.execute(select(elicitation_events).order_by(elicitation_events.c.id))).mappings().all()
    for row in audited:
        record = await connector_store.elicitations.get(row["elicitation_id"])
        assert record is not None
        assert record.created_at <= row["at"] <= record.updated_at or row["event"] in ("completion_sent", "opened")
        assert row["at"].utcoffset() is not None
        if row["event"] == "created":
            assert row["at"] == record.created_at
    return {
        "audit_events": [
            (
                place[row["elicitation_id"]],
                row["event"],
                row["identity_issuer"],
                row["identity_subject"],
                row["provider"],
                row["detail"],
            )
            for row in audited
            if row["elicitation_id"] in place
        ],
        "elicitation_events": [
            (place[row["elicitation_id"]], row["connection_key"], row["status"], row["kind"], row["detail"])
            for row in logged
            if row["elicitation_id"] in place
        ],
    }


def without_random_ids(rows: list[tuple[Any, ...]], ids: dict[str, str]) -> list[tuple[Any, ...]]:
    """`rows` with each grant id and connection key (random per deployment) named by its first appearance."""

    def named(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        for random_id, name in ids.items():
            value = value.replace(random_id, name)
        return value

    return [tuple(named(v) for v in row) for row in rows]


async def flows_on(deployment: Deployment) -> Trail:
    ids = await run_flows(deployment)
    rows = await trail(deployment, ids)
    connector_store = deployment.connector.runtime.store
    randoms: dict[str, str] = {}
    for grant in await connector_store.grants.find(deployment.local_user, "github"):
        randoms[grant.id] = "grant"
    for n, elicitation_id in enumerate(ids):
        record = await connector_store.elicitations.get(elicitation_id)
        assert record is not None
        randoms.setdefault(record.connection_key, f"connection-{n}")
    # Sorted: the client's answer and the browser's page race, so the order of their rows is not the flow's.
    return {table: sorted(without_random_ids(table_rows, randoms), key=repr) for table, table_rows in rows.items()}


async def assert_notes_hold_no_secret(deployment: Deployment) -> None:
    """The notes SQLite's steps left on the rows hold the audit and event-log rows only, and no secret."""
    async with deployment.connector.runtime.store.db.reader.connect() as conn:
        notes = (await conn.execute(select(elicitations.c.step_note))).scalars().all()
    assert notes and all(set(json.loads(note)) <= {"audit_events", "elicitation_events"} for note in notes)
    secrets = deployment.provider.secrets_issued()
    assert secrets and not [secret for secret in secrets for note in notes if secret in note]


@pytest.mark.postgres
async def test_the_audit_trail_and_event_log_are_the_same_on_both_databases(
    deploy_with: Deploy, connector_env: dict[str, str], tmp_path: Any, mock_provider: Any
) -> None:
    async with deploy_with() as on_sqlite:  # the SQLite file of `connector_env`
        assert on_sqlite.connector.runtime.store.db.writer.dialect.name == "sqlite"
        sqlite_trail = await flows_on(on_sqlite)
        await assert_notes_hold_no_secret(on_sqlite)
    # The first deployment's server closed its socket: the second serves on one of its own.
    with listening_socket("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        moved = {"CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}", "CONNECTOR_SERVER__PORT": str(port)}
        async with (
            fresh_postgres_database(migrated=True) as url,
            deploy(connector_env, tmp_path, mock_provider, sock, CONNECTOR_DATABASE__URL=url, **moved) as on_pg,
        ):
            postgres_trail = await flows_on(on_pg)

    events = [row[1] for row in sqlite_trail["audit_events"]]
    assert events.count("created") == 7 and events.count("completion_sent") == 2, events
    assert "mallory\\x01" in [row[3] for row in sqlite_trail["audit_events"]]  # escaped, on both
    assert len(sqlite_trail["elicitation_events"]) == 7  # one ending each (the last cancelled as `asking` ends)
    for table in ("audit_events", "elicitation_events"):
        assert len(sqlite_trail[table]) == len(postgres_trail[table]), table
        for on_sqlite_row, on_pg_row in zip(sqlite_trail[table], postgres_trail[table], strict=True):
            assert on_sqlite_row == on_pg_row, table


class Boom(Exception):
    pass


async def test_a_steps_rows_are_written_once_and_only_when_its_change_happens(store: Store) -> None:  # noqa: F811
    rec = elicitation()

    def entry(event: str) -> AuditEntry:
        return AuditEntry(event, NOW, rec.id, rec.identity, rec.provider)

    await store.elicitations.insert(rec, audit=entry("created"))
    # A move its status does not allow (pending -> authorizing) writes nothing.
    assert (
        await store.elicitations.transition(rec.id, ElicitationStatus.AUTHORIZING, now=NOW, audit=entry("verified"))
        is None
    )
    assert await store.elicitations.transition(rec.id, ElicitationStatus.CONSENTED, now=NOW, audit=entry("consented"))
    # Changes that carry no audit row write none, though the row holds the last step's note on SQLite.
    assert await store.elicitations.add_identity_mismatch(rec.id, now=NOW) == 1
    assert await store.elicitations.transition(rec.id, ElicitationStatus.VERIFIED, now=NOW)
    # A step whose transaction rolls back leaves no row.
    with pytest.raises(Boom):
        async with store.transaction() as tx:
            moved = await store.elicitations.transition(
                rec.id, ElicitationStatus.AUTHORIZING, now=NOW, conn=tx, audit=entry("verified")
            )
            assert moved is not None
            raise Boom
    ending = ElicitationEvent(rec.id, ElicitationStatus.DECLINED, rec.connection_key)
    async with store.transaction() as tx:
        ended = await store.elicitations.end(
            rec.id, ElicitationStatus.DECLINED, ending, now=NOW, conn=tx, audit=entry("declined")
        )
    assert ended is not None
    again = replace(ending, status=ElicitationStatus.CANCELLED)
    async with store.transaction() as tx:  # a terminal status never changes: no row
        assert (
            await store.elicitations.end(
                rec.id, ElicitationStatus.CANCELLED, again, now=NOW, conn=tx, audit=entry("cancelled")
            )
            is None
        )
    told = AuditEntry("completion_sent", NOW, rec.id)
    assert not await store.elicitations.settle_completion(rec.id, CompletionDelivery.SENT, audit=told)

    audited = await store.audit.list()
    assert [(a.event, a.elicitation_id, a.at) for a in audited] == [
        (event, rec.id, NOW) for event in ("created", "consented", "declined")
    ]
    assert all(a.identity == rec.identity and a.provider == rec.provider for a in audited)
    (logged,) = await store.outbox.after(0)
    assert logged == replace(ending, id=ended[1].id, at=NOW, origin=store.outbox.origin)
    assert ended[1].id == logged.id
