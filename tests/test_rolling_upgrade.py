"""Rolling upgrades: a replica serves every schema between the oldest it declares and its head, and a newer schema
for as long as that schema says this code still runs on it. Real migrations, a real server, /readyz on the wire."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, Table, insert, inspect, select, text, update

from service import AuthorizationStatus, ElicitationStatus, GrantEvent, GrantEventKind, GrantStatus, Identity
from service.core.agent_api import tenant_of
from service.core.records import AuditEntry, GrantRecord
from service.core.states import START_FROM
from service.core.webhooks import WebhookEndpoints, WebhookPolicy
from service.store import Store, alembic_config, head_revision, migrate, tables
from service.store.schema import OLDEST_SCHEMA_REVISION, declared_oldest_code_revision, script_location
from service.testing import ScriptedBrowser
from service.vault import KeyRing, Vault, generate_key

from .acp_peers import RecordingClient, connect, prompt_text
from .conftest import Deploy, fresh_postgres_database

FUTURE_EXPAND = '''"""A later release's expand step: a new table old code never reads.

Revision ID: 9001
Revises: {down}
"""

import sqlalchemy as sa
from alembic import op

revision = "9001"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("future_things", sa.Column("id", sa.Integer(), primary_key=True))


def downgrade() -> None:
    op.drop_table("future_things")
'''

FUTURE_CONTRACT = '''"""A later release's contract step: code older than 9001 no longer runs on it.

Revision ID: 9002
Revises: 9001
"""

import sqlalchemy as sa
from alembic import op

revision = "9002"
down_revision = "9001"
branch_labels = None
depends_on = None
oldest_code_revision = "9001"


def upgrade() -> None:
    op.add_column("future_things", sa.Column("label", sa.String(32), nullable=True))


def downgrade() -> None:
    op.drop_column("future_things", "label")
'''


NOW = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'upgrade.db'}"
        return
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture
def newer_release(tmp_path: Path) -> Iterator[Path]:
    """The migrations of a later release: this one's, then an expand step (9001) and a contract step (9002)."""
    scripts = tmp_path / "newer_migrations"
    shutil.copytree(script_location(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    versions = scripts / "versions"
    (versions / "9001_future_expand.py").write_text(FUTURE_EXPAND.format(down=head_revision()))
    (versions / "9002_future_contract.py").write_text(FUTURE_CONTRACT)
    yield scripts


def newer_config(scripts: Path, url: str) -> Config:
    config = alembic_config(url)
    config.set_main_option("script_location", str(scripts))
    return config


async def readiness(base_url: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(f"{base_url}/readyz")


async def test_the_whole_flow_runs_on_the_oldest_schema_this_code_declares(
    deploy_with: Deploy, database_url: str
) -> None:
    async with deploy_with(schema_revision=OLDEST_SCHEMA_REVISION, CONNECTOR_DATABASE__URL=database_url) as deployment:
        ready = await readiness(deployment.base_url)
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})

        client = RecordingClient(answer="accept")
        wire = await connect(deployment.connector, deployment.local_user, client)
        prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("repos")))
        url = await asyncio.wait_for(client.urls.get(), 10)
        async with ScriptedBrowser() as browser:
            final = await browser.authorize(url)
            assert final.status_code == 200, final.text
        assert (await asyncio.wait_for(prompt, 10)).stop_reason == "end_turn"
        assert wire.agent.outcomes[0].status is AuthorizationStatus.AUTHORIZED
        assert len(wire.received("elicitation/complete")) == 1
        assert deployment.provider.api_calls.count("/api/user/repos") == 1  # the token was used
        await wire.close()


async def test_an_older_replica_serves_an_expanded_schema_until_a_contract_step_retires_it(
    deploy_with: Deploy, database_url: str, newer_release: Path
) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        # The new release migrates while this (older) replica serves: an expand step keeps it ready...
        await asyncio.to_thread(command.upgrade, newer_config(newer_release, database_url), "9001")
        ready = await readiness(deployment.base_url)
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        await deployment.connector.runtime.store.check_schema()  # and a restarted old replica would start

        # ...the contract step (which needs code from 9001 on) takes it out of rotation, saying why.
        await asyncio.to_thread(command.upgrade, newer_config(newer_release, database_url), "9002")
        unready = await readiness(deployment.base_url)
        assert unready.status_code == 503
        assert unready.json()["code"] == "schema_not_current"
        assert "migrated by a newer version (revision 9002): upgrade the connector" in unready.json()["message"]


async def test_a_replica_is_unready_on_a_schema_older_than_the_oldest_it_declares(
    deploy_with: Deploy, database_url: str
) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0001")
        unready = await readiness(deployment.base_url)
        assert unready.status_code == 503
        assert unready.json()["code"] == "schema_not_current"
        assert f"(revision 0001, need {OLDEST_SCHEMA_REVISION} or later)" in unready.json()["message"]


# What each revision added that the release before it never names: an older replica must keep working beside it.
PREVIOUS_RELEASE_LACKS = {
    "0011": {
        "webhook_endpoints": ("previous_secret_key_id", "previous_secret_ciphertext", "previous_secret_expires_at")
    },
    "0012": {
        "grants": (
            "health_status",
            "health_reason",
            "health_changed_at",
            "last_refresh_at",
            "last_failure_at",
            "next_refresh_at",
            "refresh_failures",
        ),
        "elicitation_events": ("kind", "detail"),
    },
    "0013": {"elicitations": ("connection_values",)},
    "0019": {"grants": ("account_label", "account_name"), "elicitations": ("account",)},
    "0020": {"elicitations": ("step_note",)},
    "0021": {"elicitations": ("step_blob",)},
}


def as_before(revision: str, table: Table) -> Table:
    """`table` as the release before `revision` declared it (without the columns `revision` and later ones added)."""
    lacking = {
        column
        for added, tables_added in PREVIOUS_RELEASE_LACKS.items()
        if added >= revision
        for column in tables_added.get(table.name, ())
    }
    return Table(table.name, MetaData(), *(c._copy() for c in table.columns if c.name not in lacking))


async def test_the_previous_release_works_on_the_webhook_secret_rotation_columns(database_url: str) -> None:
    """0011 is expand-only: it promises what 0010 promised (older code runs on it), and a replica of the previous
    release writes and reads webhook endpoints beside this one, which rotates their secrets; downgrading keeps
    the endpoints and their current secrets."""
    script = ScriptDirectory.from_config(alembic_config())
    assert declared_oldest_code_revision(script, "0011") == declared_oldest_code_revision(script, "0010")
    assert OLDEST_SCHEMA_REVISION >= "0011"  # this code reads the new columns: it needs them
    migrate(database_url)
    old_table = as_before("0011", tables.webhook_endpoints)
    vault = Vault(KeyRing.from_strings([generate_key("k1")]))
    store = Store.from_url(database_url)
    try:
        endpoints = WebhookEndpoints(store.webhooks, store.outbox, vault, WebhookPolicy(), lambda: NOW)
        mine, _ = await endpoints.create("agent-a", "https://hooks.example.com/new", None)
        await endpoints.rotate_secret(mine)
        theirs = {**{c.name: getattr(mine, c.name) for c in old_table.columns}, "id": "wh_old_release"}
        async with store.engine.begin() as conn:
            await conn.execute(insert(old_table).values(theirs))  # what the previous release inserts
            rows = (await conn.execute(select(old_table).order_by(old_table.c.id))).mappings().all()
        assert [row["id"] for row in rows] == sorted([mine.id, "wh_old_release"])  # ...and reads
        old_row = await store.webhooks.endpoint("wh_old_release")
        assert old_row is not None and old_row.previous_secret_ciphertext is None
    finally:
        await store.close()

    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0010")
    store = Store.from_url(database_url)
    try:
        async with store.engine.connect() as conn:
            kept = (await conn.execute(select(old_table).where(old_table.c.id == mine.id))).mappings().one()
        assert (kept["secret_key_id"], kept["tenant"]) == ("k1", "agent-a")
    finally:
        await store.close()


async def test_the_previous_release_works_on_the_grant_health_columns_and_grant_events(database_url: str) -> None:
    """0012 is expand-only: it promises what 0011 promised; a previous-release replica stores and reads grants
    beside this one, which marks one needs_user (a grant the previous release stores anew is active again), and
    reads the event log with a grant event in it as the end of an elicitation nobody waits for, on no tenant's
    connection; downgrading keeps the grants."""
    script = ScriptDirectory.from_config(alembic_config())
    assert declared_oldest_code_revision(script, "0012") == declared_oldest_code_revision(script, "0011")
    assert OLDEST_SCHEMA_REVISION >= "0012"  # this code reads the new columns: it needs them
    migrate(database_url)
    old_grants = as_before("0012", tables.grants)
    old_log = as_before("0012", tables.elicitation_events)
    store = Store.from_url(database_url)
    alice = Identity("https://login.example.com", "alice")
    try:
        mine = GrantRecord(
            id="g-new",
            identity=alice,
            provider="github",
            provider_account_id="1001",
            scopes=("read:user",),
            token_key_id="k1",
            token_ciphertext=b"tokens-1",
            token_expires_at=None,
            created_at=NOW,
            updated_at=NOW,
        )
        await store.grants.upsert(mine)
        marked_at = NOW + timedelta(minutes=1)
        assert await store.grants.mark_needs_user(mine.id, reason="revoked", now=marked_at, tokens=b"tokens-1")
        event = GrantEvent(GrantEventKind.NEEDS_USER, mine.id, alice, "github", "1001", reason="revoked")
        async with store.transaction() as tx:
            await store.outbox.append([event], at=marked_at, conn=tx)
        async with store.engine.begin() as conn:
            # The previous release stores a grant of its own and reads them all...
            row = (await conn.execute(select(old_grants).where(old_grants.c.id == mine.id))).mappings().one()
            await conn.execute(insert(old_grants).values({**row, "id": "g-old", "provider_account_id": "2"}))
            listed = (await conn.execute(select(old_grants).order_by(old_grants.c.id))).mappings().all()
            # ...and reads the log as it always did: a status it knows, a connection key of no tenant.
            logged = (await conn.execute(select(old_log))).mappings().all()
        assert [r["id"] for r in listed] == ["g-new", "g-old"]
        assert [
            (r["elicitation_id"], ElicitationStatus(r["status"]), tenant_of(r["connection_key"])) for r in logged
        ] == [(mine.id, ElicitationStatus.FAILED, None)]
        assert (await store.grants.get(mine.id)).health.status is GrantStatus.NEEDS_USER  # type: ignore[union-attr]
        assert (await store.grants.get("g-old")).health.status is GrantStatus.ACTIVE  # type: ignore[union-attr]
        # The previous release authorizes the user again (its upsert knows nothing of health): active again.
        async with store.engine.begin() as conn:
            await conn.execute(
                update(old_grants)
                .where(old_grants.c.id == mine.id)
                .values(token_ciphertext=b"tokens-2", updated_at=marked_at + timedelta(minutes=1))
            )
        assert (await store.grants.get(mine.id)).health.status is GrantStatus.ACTIVE  # type: ignore[union-attr]
        (read_back,) = await store.outbox.after(0)
        assert read_back == replace(event, id=read_back.id, at=marked_at, origin=store.outbox.origin)
    finally:
        await store.close()

    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0011")
    store = Store.from_url(database_url)
    try:
        async with store.engine.connect() as conn:
            kept = (await conn.execute(select(old_grants.c.id).order_by(old_grants.c.id))).scalars().all()
        assert kept == ["g-new", "g-old"]
    finally:
        await store.close()


async def test_the_previous_release_works_on_the_connection_values_column(database_url: str) -> None:
    """0013 is expand-only: it promises what 0012 promised, a replica of the previous release inserts and reads
    elicitations beside this one (whose rows carry the agent's per-connection values), and this one reads the
    older rows as having none; downgrading keeps the elicitations."""
    from .test_store import elicitation

    script = ScriptDirectory.from_config(alembic_config())
    assert declared_oldest_code_revision(script, "0013") == declared_oldest_code_revision(script, "0012")
    assert OLDEST_SCHEMA_REVISION >= "0013"  # this code reads the new column: it needs it
    migrate(database_url)
    old_table = as_before("0013", tables.elicitations)
    store = Store.from_url(database_url)
    try:
        mine = elicitation(provider="shopify", connection_values={"subdomain": "acme"})
        await store.elicitations.insert(mine)
        async with store.engine.begin() as conn:
            row = (await conn.execute(select(old_table).where(old_table.c.id == mine.id))).mappings().one()
            await conn.execute(insert(old_table).values({**row, "id": "old-release-elicitation"}))
            ids = (await conn.execute(select(old_table.c.id))).scalars().all()  # ...and reads
        assert sorted(ids) == sorted([mine.id, "old-release-elicitation"])
        theirs = await store.elicitations.get("old-release-elicitation")
        assert theirs is not None and theirs.connection_values == {}
        again = await store.elicitations.get(mine.id)
        assert again is not None and again.connection_values == {"subdomain": "acme"}
    finally:
        await store.close()

    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0012")
    store = Store.from_url(database_url)
    try:
        async with store.engine.connect() as conn:
            kept = (await conn.execute(select(old_table).where(old_table.c.id == mine.id))).mappings().one()
        assert kept["provider"] == "shopify"
    finally:
        await store.close()


async def test_0015_gives_each_existing_grant_the_tenant_that_made_it(database_url: str) -> None:
    """0015 is a contract step (the grant's key gains the tenant: an older replica's upsert cannot run on it).
    Existing grants go to the tenant of the elicitation that stored them (the audit trail's `completed` event, the
    elicitation's connection key), else to the one tenant with API keys, else to `embedded`; downgrading keeps the
    newest grant of each account."""
    script = ScriptDirectory.from_config(alembic_config())
    assert declared_oldest_code_revision(script, "0015") == "0015"
    assert OLDEST_SCHEMA_REVISION >= "0015"
    await asyncio.to_thread(command.upgrade, alembic_config(database_url), "0013")
    now = datetime.now(UTC)
    before = as_before("0019", tables.grants)
    old_grants = Table("grants", MetaData(), *(c._copy() for c in before.columns if c.name != "tenant"))

    def grant_row(grant_id: str, subject: str) -> dict[str, object]:
        return {
            "id": grant_id,
            "identity_issuer": "https://login.example.com",
            "identity_subject": subject,
            "provider": "github",
            "provider_account_id": "acct-1",
            "scopes": '["repo"]',
            "token_key_id": "k1",
            "token_ciphertext": b"-",
            "created_at": now,
            "updated_at": now,
        }

    def event_row(elicitation_id: str, key: str) -> dict[str, object]:
        return {
            "elicitation_id": elicitation_id,
            "connection_key": key,
            "status": "completed",
            "at": now,
            "origin": "o",
        }

    def completed(elicitation_id: str, grant_id: str) -> dict[str, object]:
        return {
            "at": now,
            "event": "completed",
            "elicitation_id": elicitation_id,
            "detail": f'{{"grant_id": "{grant_id}"}}',
        }

    def key_row(key_id: str, tenant: str) -> dict[str, object]:
        return {"id": key_id, "key_hash": key_id, "tenant": tenant, "agent_name": "A", "created_at": now}

    store = Store.from_url(database_url)
    try:
        async with store.engine.begin() as conn:
            for grant_id, subject in (("g-api", "u1"), ("g-embedded", "u2"), ("g-unknown", "u3")):
                await conn.execute(insert(old_grants).values(grant_row(grant_id, subject)))
            await conn.execute(insert(tables.elicitation_events).values(event_row("e-api", "v1:agent-x:c1")))
            await conn.execute(insert(tables.elicitation_events).values(event_row("e-embedded", "acp:conn-7")))
            await conn.execute(insert(tables.audit_events).values(completed("e-api", "g-api")))
            await conn.execute(insert(tables.audit_events).values(completed("e-embedded", "g-embedded")))
            await conn.execute(insert(tables.api_keys).values(key_row("ak_1", "agent-x")))
            await conn.execute(insert(tables.api_keys).values(key_row("ak_2", "agent-y")))
    finally:
        await store.close()

    async def tenants_after_upgrade() -> dict[str, str]:
        await asyncio.to_thread(command.upgrade, alembic_config(database_url), "0015")
        store = Store.from_url(database_url)
        try:
            async with store.engine.connect() as conn:
                rows = (await conn.execute(select(tables.grants.c.id, tables.grants.c.tenant))).all()
        finally:
            await store.close()
        return {grant_id: tenant for grant_id, tenant in rows}

    # Two tenants have keys: an unknown grant is the embedded connector's.
    assert await tenants_after_upgrade() == {"g-api": "agent-x", "g-embedded": "embedded", "g-unknown": "embedded"}
    # Again with one tenant's keys only: an unknown grant is that tenant's.
    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0013")
    store = Store.from_url(database_url)
    try:
        async with store.engine.begin() as conn:
            await conn.execute(tables.api_keys.delete().where(tables.api_keys.c.tenant == "agent-y"))
    finally:
        await store.close()
    assert await tenants_after_upgrade() == {"g-api": "agent-x", "g-embedded": "embedded", "g-unknown": "agent-x"}

    # At head, two tenants may hold the same account; the downgrade keeps the newest of them.
    migrate(database_url)
    store = Store.from_url(database_url)
    try:
        original = await store.grants.get("g-api")
        assert original is not None
        later = replace(original, id="g-api-b", tenant="agent-b", updated_at=now + timedelta(seconds=1))
        await store.grants.upsert(later)
        assert {g.tenant for g in await store.grants.find(original.identity, "github")} == {"agent-x", "agent-b"}
    finally:
        await store.close()
    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0013")
    store = Store.from_url(database_url)
    try:
        async with store.engine.connect() as conn:
            ids = sorted((await conn.execute(select(old_grants.c.id))).scalars().all())
        assert ids == ["g-api-b", "g-embedded", "g-unknown"]
    finally:
        await store.close()


async def test_the_previous_release_works_on_the_account_columns(database_url: str) -> None:
    """0019 is expand-only: it promises what 0018 promised, a replica of the previous release stores and reads
    grants and elicitations beside this one (whose rows carry account labels and the account asked for), and this
    one reads the older rows as unnamed; downgrading keeps the grants."""
    from service.core.accounts import AccountAsk

    from .test_store import elicitation, grant

    script = ScriptDirectory.from_config(alembic_config())
    assert declared_oldest_code_revision(script, "0019") == declared_oldest_code_revision(script, "0018")
    assert OLDEST_SCHEMA_REVISION >= "0019"  # this code reads the new columns: it needs them
    migrate(database_url)
    old_grants = as_before("0019", tables.grants)
    old_elicitations = as_before("0019", tables.elicitations)
    store = Store.from_url(database_url)
    try:
        mine = replace(grant(), account_label="work", account_name="alice@work.example")
        await store.grants.upsert(mine)
        asked = replace(elicitation(), account=AccountAsk("work", ("personal",), new=True))
        await store.elicitations.insert(asked)
        async with store.engine.begin() as conn:  # the previous release writes...
            row = (await conn.execute(select(old_grants).where(old_grants.c.id == mine.id))).mappings().one()
            theirs = {**row, "id": "old-release-grant", "provider_account_id": "acct-old"}
            await conn.execute(insert(old_grants).values(theirs))
            row = (
                (await conn.execute(select(old_elicitations).where(old_elicitations.c.id == asked.id))).mappings().one()
            )
            await conn.execute(insert(old_elicitations).values({**row, "id": "old-release-elicitation"}))
        old = await store.grants.get("old-release-grant")
        assert old is not None and (old.account_label, old.account_name) == (None, None)
        again = await store.grants.get(mine.id)
        assert again is not None and (again.account_label, again.account_name) == ("work", "alice@work.example")
        old_asked = await store.elicitations.get("old-release-elicitation")
        assert old_asked is not None and old_asked.account is None
        again_asked = await store.elicitations.get(asked.id)
        assert again_asked is not None and again_asked.account == AccountAsk("work", ("personal",), new=True)
    finally:
        await store.close()

    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0018")
    store = Store.from_url(database_url)
    try:
        async with store.engine.connect() as conn:
            kept = sorted((await conn.execute(select(old_grants.c.id))).scalars().all())
        assert kept == sorted([mine.id, "old-release-grant"])
    finally:
        await store.close()


async def test_the_previous_release_works_on_the_step_note_and_its_triggers(database_url: str) -> None:
    """0020 is expand-only: the previous release inserts and moves elicitations beside this one without naming
    `step_note`, and SQLite's triggers write no audit or event-log row for its statements (they copy only a note a
    statement sets); this one's steps write theirs. Downgrading drops the triggers and keeps the elicitations."""
    from .test_store import elicitation

    script = ScriptDirectory.from_config(alembic_config())
    assert declared_oldest_code_revision(script, "0020") == declared_oldest_code_revision(script, "0019")
    assert OLDEST_SCHEMA_REVISION >= "0020"  # this code writes the note: it needs it (and SQLite the triggers)
    migrate(database_url)
    old_table = as_before("0020", tables.elicitations)
    store = Store.from_url(database_url)
    try:
        mine = elicitation()
        await store.elicitations.insert(mine, audit=AuditEntry("created", NOW, mine.id, mine.identity, "github"))
        async with store.engine.begin() as conn:  # the previous release inserts and moves one of its own
            row = (await conn.execute(select(old_table).where(old_table.c.id == mine.id))).mappings().one()
            await conn.execute(insert(old_table).values({**row, "id": "old-release-elicitation"}))
            moved = update(old_table).where(old_table.c.id.in_([mine.id, "old-release-elicitation"]))
            await conn.execute(moved.values(status=ElicitationStatus.DECLINED.value))
        assert [(a.event, a.elicitation_id) for a in await store.audit.list()] == [("created", mine.id)]
        assert await store.outbox.after(0) == []
        theirs = await store.elicitations.get("old-release-elicitation")
        assert theirs is not None and theirs.status is ElicitationStatus.DECLINED
    finally:
        await store.close()

    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0019")
    store = Store.from_url(database_url)
    try:
        async with store.engine.connect() as conn:
            kept = sorted((await conn.execute(select(old_table.c.id))).scalars().all())
            triggers = []
            if conn.dialect.name == "sqlite":
                listed = await conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'"))
                triggers = listed.scalars().all()
        assert kept == sorted([mine.id, "old-release-elicitation"])
        assert triggers == []
    finally:
        await store.close()


async def test_the_previous_release_works_on_the_carried_rows_and_their_triggers(database_url: str) -> None:
    """0021 is expand-only: the previous release moves elicitations with the notes it writes (audit rows only,
    copied by 0020's triggers), and inserts its flow rows and grants itself, without naming `step_blob`; 0021's
    triggers neither insert a row for its statements nor clear its notes. This one's steps carry theirs. Downgrading
    to 0020 drops 0021's triggers and the column, keeps every row and 0020's triggers."""
    from service.store.audit import audit_row
    from service.store.flow_rows import flow_row
    from service.store.grant_rows import to_row as grant_row
    from service.store.step_writes import SqliteSteps

    from .test_store import elicitation, flow, grant

    script = ScriptDirectory.from_config(alembic_config())
    assert declared_oldest_code_revision(script, "0021") == declared_oldest_code_revision(script, "0020")
    assert OLDEST_SCHEMA_REVISION >= "0021"  # this code's steps carry the flow row and a first grant on SQLite
    migrate(database_url)
    old_elicitations = as_before("0021", tables.elicitations)
    store = Store.from_url(database_url)
    sqlite = store.engine.dialect.name == "sqlite"
    try:
        mine, theirs = elicitation(), elicitation(id="old-release-elicitation")
        mine_flow, their_flow = flow(mine.id), flow(theirs.id)
        await store.elicitations.insert(mine)
        async with store.engine.begin() as conn:  # the previous release starts a flow of its own: 0020's statements
            row = (await conn.execute(select(old_elicitations).where(old_elicitations.c.id == mine.id))).mappings()
            await conn.execute(insert(old_elicitations).values({**row.one(), "id": theirs.id}))
            moved = update(old_elicitations).where(old_elicitations.c.id == theirs.id)
            values: dict[str, object] = {"status": ElicitationStatus.AUTHORIZING.value}
            if sqlite:  # its step's audit row, in the note 0020's trigger copies
                audit = audit_row(AuditEntry("verified", NOW, theirs.id, theirs.identity, "github"))
                values["step_note"] = SqliteSteps(conn.dialect).note(audit)
            await conn.execute(moved.values(values))
            await conn.execute(insert(tables.oauth_flows).values(flow_row(their_flow)))
            await conn.execute(insert(tables.grants).values(grant_row(grant(account="old-release"))))
        entry = AuditEntry("verified", NOW, mine.id, mine.identity, "github")
        assert await store.elicitations.transition(
            mine.id, ElicitationStatus.AUTHORIZING, now=NOW, from_=START_FROM, audit=entry, flow=mine_flow
        )
        async with store.engine.connect() as conn:
            flows = (await conn.execute(select(tables.oauth_flows))).mappings().all()
            notes = dict((await conn.execute(select(tables.elicitations.c.id, tables.elicitations.c.step_note))).all())
            blobs = (await conn.execute(select(tables.elicitations.c.step_blob))).scalars().all()
            held = (await conn.execute(select(tables.grants.c.provider_account_id))).scalars().all()
        assert sorted((dict(f) for f in flows), key=lambda f: f["id"]) == sorted(
            [flow_row(mine_flow), flow_row(their_flow)], key=lambda f: f["id"]
        )
        assert held == ["old-release"] and blobs == [None, None]
        assert notes[theirs.id] == values.get("step_note") and notes[mine.id] is None  # theirs kept, mine cleared
        audited = [(a.event, a.elicitation_id) for a in await store.audit.list()]
        assert sorted(audited) == sorted([("verified", mine.id), *([("verified", theirs.id)] if sqlite else [])])
    finally:
        await store.close()

    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0020")
    store = Store.from_url(database_url)
    try:
        async with store.engine.connect() as conn:
            kept = sorted((await conn.execute(select(old_elicitations.c.id))).scalars().all())
            flow_ids = sorted((await conn.execute(select(tables.oauth_flows.c.id))).scalars().all())
            columns = {c["name"] for c in await conn.run_sync(lambda c: inspect(c).get_columns("elicitations"))}
            triggers = []
            if sqlite:
                listed = await conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'"))
                triggers = sorted(listed.scalars().all())
        assert kept == sorted([mine.id, theirs.id]) and flow_ids == sorted([mine_flow.id, their_flow.id])
        assert "step_blob" not in columns and "step_note" in columns
        assert triggers == (["elicitations_step_inserted", "elicitations_step_updated"] if sqlite else [])
    finally:
        await store.close()
