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
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from service import ElicitationStatus, Identity
from service.core.events import ElicitationEvent
from service.core.records import AuditEntry, ElicitationRecord, GrantRecord
from service.core.states import START_FROM, CompletionDelivery
from service.store import Store
from service.store.flow_rows import flow_row
from service.store.grant_rows import to_row as grant_row
from service.store.tables import audit_events, elicitation_events, elicitations, grants, oauth_flows
from service.testing import ScriptedBrowser
from service.web.server import listening_socket

from .conftest import Deploy, Deployment, deploy, fresh_postgres_database
from .flow_support import Pending, asking, status_of
from .test_store import NOW, elicitation, flow, store  # noqa: F401 - `store`: the fixture, on both databases
from .test_store import grant as a_grant

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
        started = (await conn.execute(select(oauth_flows).order_by(oauth_flows.c.created_at))).mappings().all()
        given = (await conn.execute(select(grants).order_by(grants.c.created_at))).mappings().all()
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
        # The flows and grants the steps wrote (SQLite: carried by the step's note, 0021); times, the random nonce
        # and the ciphertexts (the vault's random nonces) compared by what they are.
        "oauth_flows": [
            (
                place[row["elicitation_id"]],
                row["verifier_key_id"],
                type(row["verifier_ciphertext"]),
                len(row["verifier_ciphertext"]),
                row["nonce"] is not None,
                row["expected_issuer"],
                urlsplit(row["redirect_uri"]).path,
                row["created_at"] < row["expires_at"],
                row["used_at"] is not None,
            )
            for row in started
            if row["elicitation_id"] in place
        ],
        "grants": [
            (
                row["id"],
                row["identity_subject"],
                row["provider"],
                row["provider_account_id"],
                row["scopes"],
                row["refused_scopes"],
                row["token_key_id"],
                type(row["token_ciphertext"]),
                row["token_expires_at"] is not None,
                row["created_at"] <= row["updated_at"],
                row["health_status"],
                row["refresh_failures"],
                row["tenant"],
                row["account_label"],
                row["account_name"],
            )
            for row in given
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
    assert await carried_copies(deployment.connector.runtime.store) == []  # the flows' and the grant's (0021)
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
    assert len(sqlite_trail["oauth_flows"]) == 2 and len(sqlite_trail["grants"]) == 1
    for table in ("audit_events", "elicitation_events", "oauth_flows", "grants"):
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


async def stored_row(in_store: Store, table: Any, id: str) -> dict[str, Any]:
    async with in_store.db.reader.connect() as conn:
        return dict((await conn.execute(select(table).where(table.c.id == id))).mappings().one())


async def carried_copies(in_store: Store) -> list[tuple[Any, ...]]:
    """What SQLite's carrying steps would leave on the elicitations: a note naming a flow or a grant, a blob."""
    async with in_store.db.reader.connect() as conn:
        rows = (await conn.execute(select(elicitations.c.step_note, elicitations.c.step_blob))).all()
    return [
        (note, blob)
        for note, blob in rows
        if blob is not None or (note is not None and set(json.loads(note)) - {"audit_events", "elicitation_events"})
    ]


async def complete_with_first_grant(
    in_store: Store, rec: ElicitationRecord, given: GrantRecord, audit: AuditEntry
) -> tuple[ElicitationEvent, Any]:
    """`rec` completed with `given`, the user's first grant at its provider, in one transaction, both happening: the
    ending's event and what `end_with_first_grant` ended with (the record and the event-log row)."""
    ending = ElicitationEvent(rec.id, ElicitationStatus.COMPLETED, rec.connection_key)
    async with in_store.transaction() as tx:
        inserted, ended = await in_store.elicitations.end_with_first_grant(
            rec.id, ElicitationStatus.COMPLETED, ending, given, now=NOW, conn=tx, audit=audit
        )
    assert inserted and ended is not None and ended[0].status is ElicitationStatus.COMPLETED
    return ending, ended


async def test_a_steps_flow_and_first_grant_go_in_with_it_and_leave_no_copy(store: Store) -> None:  # noqa: F811
    """The flow a step starts and a user's first grant are written by the step's statement (SQLite: its note and
    `step_blob`, migration 0021), every field as given, the ciphertexts byte for byte; nothing of them stays on the
    elicitation; a move its status does not allow writes no flow; a first grant goes in without its ending when the
    status does not allow the ending, and neither does when its account holds a grant by now."""
    rec = elicitation()

    def entry(event: str, of: ElicitationRecord = rec) -> AuditEntry:
        return AuditEntry(event, NOW, of.id, of.identity, of.provider)

    await store.elicitations.insert(rec, audit=entry("created"))
    started = flow(rec.id)
    refused = replace(started, id="refused-flow", state_hash="refused-state")
    # The elicitation is pending: completed is not allowed from there, so no flow and no audit row.
    assert not await store.elicitations.transition(
        rec.id, ElicitationStatus.COMPLETED, now=NOW, audit=entry("verified"), flow=refused
    )
    with pytest.raises(Boom):  # a step whose transaction rolls back leaves no flow
        async with store.transaction() as tx:
            assert await store.elicitations.transition(
                rec.id,
                ElicitationStatus.AUTHORIZING,
                now=NOW,
                from_=START_FROM,
                conn=tx,
                audit=entry("verified"),
                flow=refused,
            )
            raise Boom
    moved = await store.elicitations.transition(
        rec.id, ElicitationStatus.AUTHORIZING, now=NOW, from_=START_FROM, audit=entry("verified"), flow=started
    )
    assert moved is not None and moved.status is ElicitationStatus.AUTHORIZING
    assert await stored_row(store, oauth_flows, started.id) == flow_row(started)
    async with store.db.reader.connect() as conn:
        flow_ids = (await conn.execute(select(oauth_flows.c.id))).scalars().all()
    assert flow_ids == [started.id]
    assert await carried_copies(store) == []

    given = a_grant(created_at=NOW, updated_at=NOW, account_label="work", account_name="Alice at work")
    ending, ended = await complete_with_first_grant(store, rec, given, entry("completed"))
    assert await stored_row(store, grants, given.id) == grant_row(given)
    assert await store.grants.get(given.id) == given
    assert await carried_copies(store) == []

    # Another elicitation for the same account: it holds a grant by now, so neither the grant nor the ending.
    other = elicitation()
    await store.elicitations.insert(other)
    await store.elicitations.transition(other.id, ElicitationStatus.AUTHORIZING, now=NOW, from_=START_FROM)
    same_account = a_grant(scopes=("repo",))
    async with store.transaction() as tx:
        assert await store.elicitations.end_with_first_grant(
            other.id,
            ElicitationStatus.COMPLETED,
            replace(ending, elicitation_id=other.id),
            same_account,
            now=NOW,
            conn=tx,
            audit=entry("completed", other),
        ) == (False, None)
    assert await store.grants.get(same_account.id) is None
    assert await store.grants.get(given.id) == given
    assert (await store.elicitations.get(other.id)) == replace(other, status=ElicitationStatus.AUTHORIZING)

    # Cancelled meanwhile: the grant the user gave goes in, the elicitation stays cancelled.
    await store.elicitations.transition(other.id, ElicitationStatus.CANCELLED, now=NOW)
    another_account = a_grant(account="2002")
    async with store.transaction() as tx:
        assert await store.elicitations.end_with_first_grant(
            other.id,
            ElicitationStatus.COMPLETED,
            replace(ending, elicitation_id=other.id),
            another_account,
            now=NOW,
            conn=tx,
            audit=entry("completed", other),
        ) == (True, None)
    assert await store.grants.get(another_account.id) == another_account
    assert (await store.elicitations.get(other.id)).status is ElicitationStatus.CANCELLED  # type: ignore[union-attr]
    assert await carried_copies(store) == []

    assert [(a.event, a.elicitation_id) for a in await store.audit.list()] == [
        ("created", rec.id),
        ("verified", rec.id),
        ("completed", rec.id),
    ]
    (logged,) = await store.outbox.after(0)
    assert logged.id == ended[1].id and logged.status is ElicitationStatus.COMPLETED


# PostgreSQL stores no NUL in a text column (it refuses the statement); SQLite stores one as any other character.
@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
async def test_a_carried_row_whose_text_holds_a_nul_is_stored_as_given(store: Store) -> None:  # noqa: F811
    """SQLite's json_extract cuts a text at its first NUL, so a flow or a first grant holding one is not carried by
    the step's note (0021): it is stored field for field all the same, the grant under its user's identity and
    account (not under another user's that the cut would make of them), nothing left on the elicitation."""
    cut_to = Identity(a_grant().identity.issuer, "mallory")
    user = Identity(cut_to.issuer, "mallory\x00alice")
    rec = elicitation(identity=user)

    def entry(event: str) -> AuditEntry:
        return AuditEntry(event, NOW, rec.id, rec.identity, rec.provider)

    await store.elicitations.insert(rec, audit=entry("created"))
    started = replace(flow(rec.id), nonce="nonce\x00", expected_issuer="https://github.com\x00.evil")
    moved = await store.elicitations.transition(
        rec.id, ElicitationStatus.AUTHORIZING, now=NOW, from_=START_FROM, audit=entry("verified"), flow=started
    )
    assert moved is not None and moved.status is ElicitationStatus.AUTHORIZING
    assert await stored_row(store, oauth_flows, started.id) == flow_row(started)

    given = a_grant(identity=user, account="1001\x00", account_label="work\x00", account_name="Mallory\x00")
    _, ended = await complete_with_first_grant(store, rec, given, entry("completed"))
    assert await stored_row(store, grants, given.id) == grant_row(given)
    assert await store.grants.find(cut_to, given.provider) == []
    assert await store.grants.find(user, given.provider) == [given]
    assert await carried_copies(store) == []
    assert [a.event for a in await store.audit.list()] == ["created", "verified", "completed"]
    (logged,) = await store.outbox.after(0)
    assert logged.id == ended[1].id


async def test_a_step_whose_carried_row_breaks_a_constraint_writes_nothing(store: Store) -> None:  # noqa: F811
    """The flow a step starts cannot go in (its state's hash is another flow's): the step's statement fails as a whole
    on both databases (SQLite: the trigger's INSERT aborts the UPDATE), so the elicitation is not moved and neither
    its audit row nor anything of the flow is written, nor left on the elicitation."""
    taken, rec = elicitation(), elicitation()
    for one in (taken, rec):
        await store.elicitations.insert(one)
    held = flow(taken.id)
    await store.flows.insert(held)
    clashing = flow(rec.id, state_hash=held.state_hash)
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            await store.elicitations.transition(
                rec.id,
                ElicitationStatus.AUTHORIZING,
                now=NOW,
                from_=START_FROM,
                conn=tx,
                audit=AuditEntry("verified", NOW, rec.id, rec.identity, rec.provider),
                flow=clashing,
                last=True,
            )
    assert await store.elicitations.get(rec.id) == rec
    assert await store.audit.list() == []
    async with store.db.reader.connect() as conn:
        flow_ids = (await conn.execute(select(oauth_flows.c.id))).scalars().all()
        notes = (await conn.execute(select(elicitations.c.step_note, elicitations.c.step_blob))).all()
    assert flow_ids == [held.id]
    assert notes == [(None, None), (None, None)]


async def test_a_carried_row_with_nulls_and_unusual_text_is_stored_as_given(store: Store) -> None:  # noqa: F811
    """The flow of a provider without PKCE nor OpenID (no verifier, no nonce, no issuer: NULL in the note and in
    `step_blob`) and a first grant without expiry, with no scope, a label in four scripts at the column's length and a
    name of quotes and backslashes: every field stored as given, on both databases."""
    rec = elicitation(scopes=())

    def entry(event: str) -> AuditEntry:
        return AuditEntry(event, NOW, rec.id, rec.identity, rec.provider)

    await store.elicitations.insert(rec, audit=entry("created"))
    bare = replace(flow(rec.id), verifier_key_id=None, verifier_ciphertext=None, nonce=None, expected_issuer=None)
    assert await store.elicitations.transition(
        rec.id, ElicitationStatus.AUTHORIZING, now=NOW, from_=START_FROM, audit=entry("verified"), flow=bare
    )
    assert await stored_row(store, oauth_flows, bare.id) == flow_row(bare)
    assert await carried_copies(store) == []  # cleared though it carried no ciphertext
    label = ("Arbeit Δ 仕事 🚀 " * 16)[:128]
    given = a_grant(
        scopes=(), token_expires_at=None, account_label=label, account_name="a \"b\" \\c\\ 'd' $.x", account="0"
    )
    ending = ElicitationEvent(rec.id, ElicitationStatus.COMPLETED, rec.connection_key)
    async with store.transaction() as tx:
        inserted, ended = await store.elicitations.end_with_first_grant(
            rec.id, ElicitationStatus.COMPLETED, ending, given, now=NOW, conn=tx, audit=entry("completed")
        )
    assert inserted and ended is not None
    assert await stored_row(store, grants, given.id) == grant_row(given)
    assert await store.grants.get(given.id) == given
    assert await carried_copies(store) == []
