"""Replica rows: each process sharing the database says it is alive, and who stopped saying so is gone."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from .engine import Database
from .tables import replicas


class ReplicaRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def beat(self, id: str, *, now: datetime, conn: AsyncConnection | None = None) -> None:
        """Record that replica `id` is alive at `now` (its row is created on the first beat, and again if it
        was removed as gone meanwhile). Outside the pool, so that a burst of requests cannot silence it."""
        values = {"id": id, "started_at": now, "heartbeat_at": now}
        async with self._db.write(conn) if conn is not None else self._db.write_unpooled() as c:
            insert: Any = postgresql.insert if c.dialect.name == "postgresql" else sqlite.insert
            statement = insert(replicas).values(values)
            statement = statement.on_conflict_do_update(
                index_elements=[replicas.c.id], set_={"heartbeat_at": statement.excluded.heartbeat_at}
            )
            await c.execute(statement)

    async def remove(self, id: str, conn: AsyncConnection | None = None) -> None:
        """Replica `id` stops (its connections close with it)."""
        async with self._db.write(conn) as c:
            await c.execute(delete(replicas).where(replicas.c.id == id))

    async def remove_gone(self, *, live_since: datetime, conn: AsyncConnection | None = None) -> int:
        """Remove the rows of replicas whose last heartbeat is older than `live_since`; how many."""
        async with self._db.write(conn) as c:
            result = await c.execute(delete(replicas).where(replicas.c.heartbeat_at < live_since))
        return int(result.rowcount)
