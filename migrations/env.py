"""Alembic environment: migrations on the connector's async engine (sqlite+aiosqlite, postgresql+asyncpg).

The URL comes from the programmatic config (`config.attributes["url"]`, set by `service.store.migrate`),
never from an alembic.ini. Offline mode (`--sql`) renders SQL for the same URL.
"""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from service.store.engine import create_engine
from service.store.schema import record_compatibility
from service.store.tables import metadata

config = context.config
target_metadata = metadata


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: run migrations through `acp-connector migrate`")
    return str(url)


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=_url().startswith("sqlite"),
        **kwargs,
    )


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_sync(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
        # Offline (--sql) runs do not record it: old replicas then treat the new schema as incompatible.
        record_compatibility(connection, ScriptDirectory.from_config(config))


async def run_migrations_online() -> None:
    engine = create_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_sync)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
