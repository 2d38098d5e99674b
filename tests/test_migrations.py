"""Alembic migrations on SQLite and PostgreSQL: they build exactly tables.py, go down and up, are checked."""

from __future__ import annotations

import asyncio
import io
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Connection, Index, Integer, MetaData, String, inspect, text
from sqlalchemy.engine import make_url

from service.core.errors import SchemaNotCurrent
from service.store import Store, alembic_config, create_engine, display_url, head_revision, migrate
from service.store import schema as schema_module
from service.store.tables import metadata

from .conftest import fresh_postgres_database

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of an empty, unmigrated database."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'connector.db'}"
        return
    async with fresh_postgres_database() as fresh:
        yield fresh


async def run_sync_on(url: str, fn: Any) -> Any:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(fn)
    finally:
        await engine.dispose()


def schema_diff(target: MetaData) -> Any:
    def compare(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return list(compare_metadata(context, target))

    return compare


def table_names(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


def current_revisions(conn: Connection) -> tuple[str, ...]:
    return tuple(MigrationContext.configure(conn).get_current_heads())


async def expect_schema_error(url: str) -> str:
    store = Store.from_url(url)
    try:
        with pytest.raises(SchemaNotCurrent) as caught:
            await store.check_schema()
    finally:
        await store.close()
    return str(caught.value)


async def test_upgrade_builds_exactly_the_tables_in_tables_py(url: str) -> None:
    migrate(url)

    assert await run_sync_on(url, current_revisions) == (head_revision(),)
    assert await run_sync_on(url, table_names) == set(metadata.tables) | {"alembic_version"}
    assert await run_sync_on(url, schema_diff(metadata)) == []


def trigger_names(conn: Connection) -> set[str]:
    if conn.dialect.name == "sqlite":
        return set(conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars())
    return set(conn.execute(text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")).scalars())


async def test_sqlite_writes_a_steps_rows_through_triggers_at_the_head(url: str) -> None:
    """The triggers that insert a step's audit and event-log rows from its note (0020), and the flow row and first
    grant it carries, then clear what it carried (0021), are there on SQLite, after a downgrade and upgrade too (a
    migration that rebuilds `elicitations` on SQLite would drop them); each downgrade drops its own. PostgreSQL has
    none (its steps write those rows in CTEs)."""
    on_sqlite = url.startswith("sqlite")
    of_0020 = {"elicitations_step_inserted", "elicitations_step_updated"} if on_sqlite else set()
    expected = of_0020 | ({"elicitations_step_carried", "elicitations_step_cleared"} if on_sqlite else set())
    migrate(url)
    assert await run_sync_on(url, trigger_names) == expected
    await asyncio.to_thread(command.downgrade, alembic_config(url), "0020")
    assert await run_sync_on(url, trigger_names) == of_0020
    await asyncio.to_thread(command.downgrade, alembic_config(url), "0019")
    assert await run_sync_on(url, trigger_names) == set()
    migrate(url)
    assert await run_sync_on(url, trigger_names) == expected


def test_sqlite_step_triggers_copy_every_column_of_the_rows_they_write(tmp_path: Path) -> None:
    """The triggers (0020, 0021) name the columns they copy from a step's note: a column added to one of those tables
    later must be added to its trigger too, or SQLite would store it NULL while PostgreSQL's CTE stores its value.
    Every column but a generated id is copied, at the head."""
    path = tmp_path / "connector.db"
    migrate(f"sqlite+aiosqlite:///{path}")
    with sqlite3.connect(path) as conn:
        bodies = [sql for (sql,) in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'")]
    copied: dict[str, set[str]] = {}
    for body in bodies:
        for table, columns in re.findall(r"INSERT INTO (\w+) \(([^)]*)\)", body):
            copied.setdefault(table, set()).update(c.strip() for c in columns.split(","))
    assert set(copied) == {"audit_events", "elicitation_events", "oauth_flows", "grants"}
    for table, columns in copied.items():
        generated = {c.name for c in metadata.tables[table].primary_key if isinstance(c.type, Integer)}
        assert columns == {c.name for c in metadata.tables[table].c} - generated, table


async def test_the_schema_comparison_notices_a_drift(url: str) -> None:
    """Guards the test above: a table definition that differs from the migration must show up as a diff."""
    migrate(url)
    drifted = MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.tables.values():
        table.to_metadata(drifted)
    grants = drifted.tables["grants"]
    grants.append_column(Column("label", String(64), nullable=True))
    Index("ix_grants_provider", grants.c.provider)

    diff = await run_sync_on(url, schema_diff(drifted))

    kinds = {(entry[0], getattr(entry[-1], "name", None)) for entry in diff}
    assert ("add_column", "label") in kinds
    assert ("add_index", "ix_grants_provider") in kinds


async def test_downgrade_to_base_and_upgrade_again(url: str) -> None:
    migrate(url)
    await asyncio.to_thread(command.downgrade, alembic_config(url), "base")

    assert await run_sync_on(url, table_names) <= {"alembic_version"}
    assert await run_sync_on(url, current_revisions) == ()
    assert "is not migrated" in await expect_schema_error(url)

    migrate(url)
    migrate(url)  # a second run is a no-op
    assert await run_sync_on(url, current_revisions) == (head_revision(),)
    assert await run_sync_on(url, schema_diff(metadata)) == []
    store = Store.from_url(url)
    try:
        await store.check_schema()
    finally:
        await store.close()


async def test_check_schema_refuses_an_unmigrated_database(url: str) -> None:
    message = await expect_schema_error(url)

    assert message == f"database at {display_url(url)} is not migrated: run `acp-connector migrate`"
    password = make_url(url).password
    assert password is None or password not in message


async def test_check_schema_refuses_tables_made_without_migrations(url: str) -> None:
    def create_all(conn: Connection) -> None:
        metadata.create_all(conn)
        conn.commit()

    await run_sync_on(url, create_all)

    assert await expect_schema_error(url) == (
        f"database at {display_url(url)} is not migrated: run `acp-connector migrate`"
    )


async def test_check_schema_refuses_a_database_migrated_by_a_newer_version(url: str) -> None:
    migrate(url)

    def stamp_future(conn: Connection) -> None:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00d_future'"))
        # ...whose schema no longer runs this code (tests/test_rolling_upgrade.py has one that still does).
        conn.execute(text("UPDATE schema_compatibility SET oldest_code_revision = 'f00d_future'"))
        conn.commit()

    await run_sync_on(url, stamp_future)

    assert await expect_schema_error(url) == (
        f"database at {display_url(url)} was migrated by a newer version (revision f00d_future): upgrade the connector"
    )


def test_migrate_from_synchronous_code_creates_a_wal_database(tmp_path: Path) -> None:
    db = tmp_path / "var" / "connector.db"
    migrate(f"sqlite+aiosqlite:///{db}")

    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head_revision(),)]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)  # WAL persists in the file


def test_offline_mode_renders_sql_without_a_database() -> None:
    config = alembic_config("postgresql+asyncpg://nobody@db.invalid/connector")
    config.output_buffer = io.StringIO()

    command.upgrade(config, "head", sql=True)

    sql = config.output_buffer.getvalue()
    for table in metadata.tables:
        assert f"CREATE TABLE {table}" in sql
    assert "TIMESTAMP WITH TIME ZONE" in sql


def test_script_location_prefers_the_packaged_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert schema_module.script_location() == REPO / "migrations"  # a checkout has no service/_migrations

    packaged = tmp_path / "_migrations"
    packaged.mkdir()
    (packaged / "env.py").write_text("")
    monkeypatch.setattr(schema_module, "_PACKAGED_SCRIPTS", packaged)
    assert schema_module.script_location() == packaged
    assert alembic_config().get_main_option("script_location") == str(packaged)


def test_the_head_read_from_the_scripts_is_alembics() -> None:
    """The schema check's fast path (no Alembic) knows the head by reading the scripts' revision lines."""
    schema_module.declared_head.cache_clear()
    assert schema_module.declared_head() == head_revision()
