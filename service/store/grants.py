"""Grant rows: one per (identity, provider, provider account), holding scopes and the encrypted token set."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.errors import ConnectorError
from service.core.identity import Identity
from service.core.records import GrantRecord

from .engine import Database, begun, dump_json
from .file_locks import FileLocks
from .grant_pages import listing
from .grant_rows import from_row as _from_row
from .grant_rows import to_row as _to_row
from .sealed import swap_sealed
from .tables import grants

# How long a replica waits for another one's refresh of the same grant (longer than a provider call may take).
REFRESH_LOCK_TIMEOUT = "30s"
REFRESH_LOCK_SECONDS = 30.0  # the same, for SQLite's file locks
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE when lock_timeout ran out

# One grant per tenant, user, provider and provider account (migration 0015: the tenant joined the key).
ACCOUNT_KEY = ("identity_issuer", "identity_subject", "provider", "tenant", "provider_account_id")
_REPLACED_ON_CONFLICT = (
    "scopes",
    "refused_scopes",
    "token_key_id",
    "token_ciphertext",
    "token_expires_at",
    "updated_at",
    # The user authorized again: the grant is healthy (its refresh history, last_*, stays).
    "health_status",
    "health_reason",
    "health_changed_at",
    "next_refresh_at",
    "refresh_failures",
    "account_label",
    "account_name",
)


def _writes(insert: Any) -> tuple[Any, Any]:
    """The upsert, and the insert of a grant for an account that holds none (nothing written when it does)."""
    new, key = insert(grants), list(ACCOUNT_KEY)
    upsert = new.on_conflict_do_update(index_elements=key, set_={n: new.excluded[n] for n in _REPLACED_ON_CONFLICT})
    return upsert.returning(*grants.c), new.on_conflict_do_nothing(index_elements=key).returning(*grants.c)


# Built once (building and keying a statement costs more than running it); values come with each execution.
_WRITES = {"postgresql": _writes(postgresql.insert), "sqlite": _writes(sqlite.insert)}
_FIND = (
    select(grants)
    .where(
        grants.c.identity_issuer == bindparam("issuer"),
        grants.c.identity_subject == bindparam("subject"),
        grants.c.provider == bindparam("provider"),
    )
    .order_by(grants.c.updated_at.desc(), grants.c.id)
)
_FIND_IN = _FIND.where(grants.c.tenant.in_(bindparam("tenants", expanding=True)))


class GrantRepository:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._file_locks: FileLocks | None = None
        if db.dialect == "sqlite":
            self._file_locks = FileLocks.beside(db.url.database, REFRESH_LOCK_SECONDS)

    @property
    def db(self) -> Database:
        return self._db

    async def upsert(self, rec: GrantRecord, conn: AsyncConnection | None = None) -> GrantRecord:
        """Insert the grant, or when the account has one, replace its scopes, tokens, expiry and key id (keeping its
        id and created_at); the stored record."""
        async with self._db.write(conn) as c:
            row = (await c.execute(_WRITES[c.dialect.name][0], _to_row(rec))).mappings().one()
        return _from_row(row)

    async def insert_new(self, rec: GrantRecord, conn: AsyncConnection | None = None) -> GrantRecord | None:
        """Insert the grant unless its account holds one already: the stored record, or None (nothing written)."""
        async with self._db.write(conn) as c:
            row = (await c.execute(_WRITES[c.dialect.name][1], _to_row(rec))).mappings().first()
        return None if row is None else _from_row(row)

    async def find(
        self,
        identity: Identity,
        provider: str,
        conn: AsyncConnection | None = None,
        *,
        tenants: Collection[str] | None = None,
    ) -> list[GrantRecord]:
        """The identity's grants at `provider` held by one of `tenants` (None: by any tenant, for operators and the
        store's own work), most recently updated first."""
        params: dict[str, Any] = {"issuer": identity.issuer, "subject": identity.subject, "provider": provider}
        if tenants is not None:
            params["tenants"] = sorted(tenants)
        async with self._db.read(conn) as c:
            rows = (await c.execute(_FIND if tenants is None else _FIND_IN, params)).mappings().all()
        return [_from_row(row) for row in rows]

    async def changed_since(self, since: datetime, conn: AsyncConnection | None = None) -> list[GrantRecord]:
        """Grants stored or refreshed at or after `since`."""
        async with self._db.read(conn) as c:
            rows = (await c.execute(select(grants).where(grants.c.updated_at >= since))).mappings().all()
        return [_from_row(row) for row in rows]

    async def listed(
        self,
        *,
        subject: str | None = None,
        issuer: str | None = None,
        provider: str | None = None,
        tenants: Collection[str] | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int = 1000,
        conn: AsyncConnection | None = None,
    ) -> list[GrantRecord]:
        """Grants matching what is given (operators' listing; `tenants`: held by one of them), keyset-paged: `after`
        is the previous page's last `(updated_at, id)` (`grant_pages.listing`)."""
        statement = listing(
            subject=subject, issuer=issuer, provider=provider, tenants=tenants, after=after, limit=limit
        )
        async with self._db.read(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return [_from_row(row) for row in rows]

    async def get(self, id: str, conn: AsyncConnection | None = None) -> GrantRecord | None:
        async with self._db.read(conn) as c:
            row = (await c.execute(select(grants).where(grants.c.id == id))).mappings().first()
        return None if row is None else _from_row(row)

    @asynccontextmanager
    async def locked_for_refresh(self, id: str) -> AsyncIterator[LockedGrant | None]:
        """The grant as stored once no other replica is refreshing it, held until the block ends; None if gone.

        On PostgreSQL the row is locked (`SELECT … FOR UPDATE`) in a transaction that lasts the block: another
        replica refreshing the same grant waits, then reads what this one stored. `LockedGrant.update_tokens`
        writes in that transaction, so the new set is committed before the lock is released. On SQLite nothing is
        held open across the provider call: the process's own lock (tokens.py) is the single flight within it, and
        a file lock beside the database (`file_locks`) across the processes sharing the file (a command run beside
        the serving one).
        """
        if self._db.dialect != "postgresql":
            async with AsyncExitStack() as held:
                if self._file_locks is not None:
                    try:  # only the lock's wait: what the block raises passes as it is
                        await held.enter_async_context(self._file_locks.hold(id))
                    except TimeoutError:
                        raise _refresh_busy() from None
                found = await self.get(id)
                yield None if found is None else LockedGrant(found, self, None)
            return
        async with begun(self._db.writer) as conn:
            await conn.execute(text(f"SET LOCAL lock_timeout = '{REFRESH_LOCK_TIMEOUT}'"))
            statement = select(grants).where(grants.c.id == id).with_for_update()
            try:
                row = (await conn.execute(statement)).mappings().first()
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                raise _refresh_busy() from None
            yield None if row is None else LockedGrant(_from_row(row), self, conn)

    async def update_tokens(
        self,
        id: str,
        *,
        token_key_id: str,
        token_ciphertext: bytes,
        token_expires_at: datetime | None,
        scopes: tuple[str, ...],
        now: datetime,
        replacing: bytes,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Store a refreshed token set (and the scopes it carries) on an existing grant, if it still holds the
        ciphertext `replacing` (the set the refresh started from): an older set never overwrites a newer one, on
        any replica. The refresh succeeded, so the grant is active and its backoff is over. False if it changed."""
        statement = (
            update(grants)
            .where(grants.c.id == id, grants.c.token_ciphertext == replacing)
            .values(
                token_key_id=token_key_id,
                token_ciphertext=token_ciphertext,
                token_expires_at=token_expires_at,
                scopes=dump_json(list(scopes)),
                updated_at=now,
                last_refresh_at=now,
                health_status=None,
                health_reason=None,
                health_changed_at=None,
                next_refresh_at=None,
                refresh_failures=None,
            )
        )
        async with self._db.write(conn) as c:
            result = await c.execute(statement)
        return result.rowcount > 0

    async def refresh_failed(
        self,
        id: str,
        *,
        now: datetime,
        next_refresh_at: datetime,
        failures: int,
        conn: AsyncConnection | None = None,
    ) -> None:
        """A transient refresh failure: no refresh of the grant before `next_refresh_at`; its tokens stay."""
        statement = (
            update(grants)
            .where(grants.c.id == id)
            .values(last_failure_at=now, next_refresh_at=next_refresh_at, refresh_failures=failures)
        )
        async with self._db.write(conn) as c:
            await c.execute(statement)

    async def mark_needs_user(
        self, id: str, *, reason: str, now: datetime, tokens: bytes, conn: AsyncConnection | None = None
    ) -> bool:
        """The provider refused the grant for good: `needs_user` for `reason`, if it still holds the ciphertext
        `tokens` (a newer set stored meanwhile was not refused). Its tokens, account and scopes stay; `updated_at`
        too (a later change of tokens, by any release, makes it active again). False if it changed or is gone."""
        statement = (
            update(grants)
            .where(grants.c.id == id, grants.c.token_ciphertext == tokens)
            .values(
                health_status="needs_user",
                health_reason=reason,
                health_changed_at=now,
                last_failure_at=now,
                next_refresh_at=None,
                refresh_failures=None,
            )
        )
        async with self._db.write(conn) as c:
            result = await c.execute(statement)
        return result.rowcount > 0

    async def count_by_key(self, conn: AsyncConnection | None = None) -> dict[str, int]:
        """How many grants each vault key id encrypts."""
        statement = select(grants.c.token_key_id, func.count()).group_by(grants.c.token_key_id)
        async with self._db.read(conn) as c:
            return {key_id: count for key_id, count in (await c.execute(statement)).all()}

    async def not_under(
        self, key_id: str, *, after: str = "", limit: int, conn: AsyncConnection | None = None
    ) -> list[GrantRecord]:
        """Up to `limit` grants whose tokens are under another key than `key_id`, by id, ids after `after`."""
        statement = (
            select(grants)
            .where(grants.c.token_key_id != key_id, grants.c.id > after)
            .order_by(grants.c.id)
            .limit(limit)
        )
        async with self._db.read(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return [_from_row(row) for row in rows]

    async def without_expiry(
        self, providers: Collection[str], *, after: str = "", limit: int, conn: AsyncConnection | None = None
    ) -> list[GrantRecord]:
        """Up to `limit` grants at one of `providers` whose access token has no stored expiry (those a legacy token
        migration looks at, `grants migrate`), by id, ids after `after`."""
        statement = (
            select(grants)
            .where(
                grants.c.provider.in_(sorted(providers)),
                grants.c.token_expires_at.is_(None),
                grants.c.id > after,
            )
            .order_by(grants.c.id)
            .limit(limit)
        )
        async with self._db.read(conn) as c:
            rows = (await c.execute(statement)).mappings().all()
        return [_from_row(row) for row in rows]

    async def swap_ciphertext(
        self,
        id: str,
        *,
        old_key_id: str,
        old_ciphertext: bytes,
        new_key_id: str,
        new_ciphertext: bytes,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Put the same tokens under another key, if the row still holds `old_*` (a refresh elsewhere may have
        stored new tokens meanwhile: then nothing changes and the answer is False). `updated_at` is kept."""
        return await swap_sealed(
            self._db,
            grants.c.token_key_id,
            grants.c.token_ciphertext,
            id,
            old=(old_key_id, old_ciphertext),
            new=(new_key_id, new_ciphertext),
            conn=conn,
        )

    async def delete(self, id: str, conn: AsyncConnection | None = None) -> bool:
        """Delete the grant; True when it existed."""
        async with self._db.write(conn) as c:
            result = await c.execute(delete(grants).where(grants.c.id == id))
        return result.rowcount > 0


def _refresh_busy() -> ConnectorError:
    return ConnectorError("another replica's refresh of this grant is taking too long; try again", code="refresh_busy")


@dataclass
class LockedGrant:
    """A grant read under its refresh lock; what a refresh learned is stored before the lock is released.

    Every write is conditional on the tokens read here (`replacing`/`tokens`): on SQLite, where nothing is held
    across the provider call, another process may have stored newer ones meanwhile."""

    grant: GrantRecord
    _repo: GrantRepository
    _tx: AsyncConnection | None

    @property
    def tx(self) -> AsyncConnection | None:
        """The lock's transaction on PostgreSQL (write in it: committed before the lock is released); else None."""
        return self._tx

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[AsyncConnection]:
        """The lock's transaction (PostgreSQL), or a write transaction of its own (SQLite)."""
        async with self._repo.db.write(self._tx) as conn:
            yield conn

    async def update_tokens(
        self,
        *,
        token_key_id: str,
        token_ciphertext: bytes,
        token_expires_at: datetime | None,
        scopes: tuple[str, ...],
        now: datetime,
    ) -> bool:
        return await self._repo.update_tokens(
            self.grant.id,
            token_key_id=token_key_id,
            token_ciphertext=token_ciphertext,
            token_expires_at=token_expires_at,
            scopes=scopes,
            now=now,
            replacing=self.grant.token_ciphertext,
            conn=self._tx,
        )

    async def refresh_failed(self, *, now: datetime, next_refresh_at: datetime, failures: int) -> None:
        await self._repo.refresh_failed(
            self.grant.id, now=now, next_refresh_at=next_refresh_at, failures=failures, conn=self._tx
        )

    async def mark_needs_user(self, *, reason: str, now: datetime, conn: AsyncConnection) -> bool:
        return await self._repo.mark_needs_user(
            self.grant.id, reason=reason, now=now, tokens=self.grant.token_ciphertext, conn=conn
        )
