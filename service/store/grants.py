"""Grant rows: one per (identity, provider, provider account), holding scopes and the encrypted token set."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, bindparam, delete, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.errors import ConnectorError
from service.core.identity import Identity
from service.core.records import GrantRecord

from .engine import Database, dump_json, load_json
from .sealed import swap_sealed
from .tables import grants

# How long a replica waits for another one's refresh of the same grant (longer than a provider call may take).
REFRESH_LOCK_TIMEOUT = "30s"
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE when lock_timeout ran out

_ACCOUNT_KEY = ("identity_issuer", "identity_subject", "provider", "provider_account_id")
_REPLACED_ON_CONFLICT = (
    "scopes",
    "refused_scopes",
    "token_key_id",
    "token_ciphertext",
    "token_expires_at",
    "updated_at",
)


def _upsert(insert: Any) -> Any:
    statement = insert(grants)
    return statement.on_conflict_do_update(
        index_elements=list(_ACCOUNT_KEY),
        set_={name: statement.excluded[name] for name in _REPLACED_ON_CONFLICT},
    ).returning(*grants.c)


# Built once (building and keying a statement costs more than running it); values come with each execution.
_UPSERT = {"postgresql": _upsert(postgresql.insert), "sqlite": _upsert(sqlite.insert)}
_FIND = (
    select(grants)
    .where(
        grants.c.identity_issuer == bindparam("issuer"),
        grants.c.identity_subject == bindparam("subject"),
        grants.c.provider == bindparam("provider"),
    )
    .order_by(grants.c.updated_at.desc(), grants.c.id)
)


class GrantRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def upsert(self, rec: GrantRecord, conn: AsyncConnection | None = None) -> GrantRecord:
        """Insert the grant, or when the account has one, replace its scopes, tokens, expiry and key id.

        An existing grant keeps its id and created_at; the stored record is returned.
        """
        async with self._db.write(conn) as c:
            statement = _UPSERT.get(c.dialect.name)
            if statement is None:  # pragma: no cover - only the two supported backends are configured
                raise NotImplementedError(f"grant upsert is not implemented for {c.dialect.name}")
            row = (await c.execute(statement, _to_row(rec))).mappings().one()
        return _from_row(row)

    async def find(self, identity: Identity, provider: str, conn: AsyncConnection | None = None) -> list[GrantRecord]:
        """The identity's grants at `provider`, most recently updated first."""
        params = {"issuer": identity.issuer, "subject": identity.subject, "provider": provider}
        async with self._db.read(conn) as c:
            rows = (await c.execute(_FIND, params)).mappings().all()
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
        limit: int = 1000,
        conn: AsyncConnection | None = None,
    ) -> list[GrantRecord]:
        """Grants matching what is given (operators' listing), most recently updated first, at most `limit`."""
        statement = select(grants).order_by(grants.c.updated_at.desc(), grants.c.id).limit(limit)
        if subject is not None:
            statement = statement.where(grants.c.identity_subject == subject)
        if issuer is not None:
            statement = statement.where(grants.c.identity_issuer == issuer)
        if provider is not None:
            statement = statement.where(grants.c.provider == provider)
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
        writes in that transaction, so the new set is committed before the lock is released. SQLite serves one
        process, whose own lock (tokens.py) is the single flight: nothing is held open across the provider call.
        """
        if self._db.dialect != "postgresql":
            found = await self.get(id)
            yield None if found is None else LockedGrant(found, self, None)
            return
        async with self._db.writer.begin() as conn:
            await conn.execute(text(f"SET LOCAL lock_timeout = '{REFRESH_LOCK_TIMEOUT}'"))
            statement = select(grants).where(grants.c.id == id).with_for_update()
            try:
                row = (await conn.execute(statement)).mappings().first()
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                raise ConnectorError(
                    "another replica's refresh of this grant is taking too long; try again", code="refresh_busy"
                ) from None
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
        conn: AsyncConnection | None = None,
    ) -> None:
        """Store a refreshed token set (and the scopes it carries) on an existing grant."""
        statement = (
            update(grants)
            .where(grants.c.id == id)
            .values(
                token_key_id=token_key_id,
                token_ciphertext=token_ciphertext,
                token_expires_at=token_expires_at,
                scopes=dump_json(list(scopes)),
                updated_at=now,
            )
        )
        async with self._db.write(conn) as c:
            await c.execute(statement)

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


@dataclass
class LockedGrant:
    """A grant read under its refresh lock; `update_tokens` stores a refreshed set before the lock is released."""

    grant: GrantRecord
    _repo: GrantRepository
    _tx: AsyncConnection | None

    async def update_tokens(
        self,
        *,
        token_key_id: str,
        token_ciphertext: bytes,
        token_expires_at: datetime | None,
        scopes: tuple[str, ...],
        now: datetime,
    ) -> None:
        await self._repo.update_tokens(
            self.grant.id,
            token_key_id=token_key_id,
            token_ciphertext=token_ciphertext,
            token_expires_at=token_expires_at,
            scopes=scopes,
            now=now,
            conn=self._tx,
        )


def _to_row(rec: GrantRecord) -> dict[str, Any]:
    return {
        "id": rec.id,
        "identity_issuer": rec.identity.issuer,
        "identity_subject": rec.identity.subject,
        "provider": rec.provider,
        "provider_account_id": rec.provider_account_id,
        "scopes": dump_json(list(rec.scopes)),
        "refused_scopes": dump_json(list(rec.refused_scopes)) if rec.refused_scopes else None,
        "token_key_id": rec.token_key_id,
        "token_ciphertext": rec.token_ciphertext,
        "token_expires_at": rec.token_expires_at,
        "created_at": rec.created_at,
        "updated_at": rec.updated_at,
    }


def _from_row(row: RowMapping) -> GrantRecord:
    return GrantRecord(
        id=row["id"],
        identity=Identity(row["identity_issuer"], row["identity_subject"]),
        provider=row["provider"],
        provider_account_id=row["provider_account_id"],
        scopes=tuple(load_json(row["scopes"])),
        refused_scopes=tuple(load_json(row["refused_scopes"])) if row["refused_scopes"] else (),
        token_key_id=row["token_key_id"],
        token_ciphertext=bytes(row["token_ciphertext"]),
        token_expires_at=row["token_expires_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
