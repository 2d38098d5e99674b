"""The store: the only place that builds SQL. `Store` bundles the engine and one repository per aggregate."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from .api import ApiElicitationRepository, ApiKeyRepository
from .audit import PENDING_AUDIT_LOG, AuditRepository, log_audit_event
from .console import AuditFilter, ConsoleRepository, GrantCounts, GrantFilter
from .elicitations import ElicitationRepository
from .engine import Database, PoolSettings, begun, connected, create_engine, database_busy, display_url
from .flows import FlowRepository
from .grants import GrantRepository
from .outbox import OutboxRepository
from .replicas import ReplicaRepository
from .retention import RetentionRepository
from .schema import alembic_config, head_revision, migrate
from .schema import check_schema as _check_schema
from .verifications import VerificationRepository
from .webhooks import WebhookRepository

__all__ = [
    "ApiElicitationRepository",
    "ApiKeyRepository",
    "AuditFilter",
    "AuditRepository",
    "ConsoleRepository",
    "Database",
    "ElicitationRepository",
    "FlowRepository",
    "GrantCounts",
    "GrantFilter",
    "GrantRepository",
    "OutboxRepository",
    "PoolSettings",
    "ReplicaRepository",
    "RetentionRepository",
    "Store",
    "VerificationRepository",
    "WebhookRepository",
    "alembic_config",
    "create_engine",
    "database_busy",
    "display_url",
    "head_revision",
    "migrate",
]


class Store:
    """The database and the repositories. Repository methods take `conn=` to join a `transaction()`.

    `engine` is the write engine (transactions, migrations); reads outside a transaction use `db.reader`.
    `origin` names this store's process in the event log (random per instance).
    """

    def __init__(self, db: Database, origin: str | None = None) -> None:
        self.db = db
        self.engine = db.writer
        self.origin = origin or secrets.token_hex(8)
        self.outbox = OutboxRepository(db, self.origin)
        self.retention = RetentionRepository(db)
        self.grants = GrantRepository(db)
        self.elicitations = ElicitationRepository(db, self.outbox, self.grants)
        self.flows = FlowRepository(db)
        self.audit = AuditRepository(db)
        self.verifications = VerificationRepository(db)
        self.api_keys = ApiKeyRepository(db)
        self.api_elicitations = ApiElicitationRepository(db)
        self.replicas = ReplicaRepository(db)
        self.webhooks = WebhookRepository(db)
        self.console = ConsoleRepository(db)

    @classmethod
    def from_url(cls, url: str, pool: PoolSettings | None = None) -> Store:
        return cls(Database.from_url(url, pool))

    def __repr__(self) -> str:
        return f"Store({display_url(self.engine.url)!r})"

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """One transaction: commits when the block ends, rolls back if it raises.

        Audit events recorded in it are logged after the commit, and not at all if it rolls back.
        """
        pending: list[Any] = []
        async with begun(self.engine) as conn:
            # Held here, not re-read in `finally`: a task cancelled mid-statement leaves `conn` invalidated, and
            # reading `conn.info` then raises PendingRollbackError, which would replace the CancelledError.
            info = conn.info
            info[PENDING_AUDIT_LOG] = pending
            try:
                yield conn
            finally:
                # The DBAPI connection returns to the pool: it must not carry this list into its next use.
                info.pop(PENDING_AUDIT_LOG, None)
        for values in pending:
            log_audit_event(values)

    async def ping(self) -> None:
        """Raise DatabaseUnavailable if the database cannot be reached."""
        async with connected(self.db.reader) as conn:
            await conn.execute(text("SELECT 1"))

    def pool_in_use(self) -> int:
        """Connections of this process's pools that are checked out now (0 for pools that do not count)."""
        pools = {id(engine.pool): engine.pool for engine in (self.db.writer, self.db.reader)}
        total = 0
        for pool in pools.values():
            checkedout = getattr(pool, "checkedout", None)
            total += int(checkedout()) if callable(checkedout) else 0
        return total

    async def check_schema(self) -> None:
        """Raise SchemaNotCurrent unless this code may run on the database's schema
        (DatabaseUnavailable if it cannot be reached)."""
        async with connected(self.db.reader) as conn:
            await _check_schema(conn)

    async def close(self) -> None:
        await self.db.dispose()
