"""Rows holding a value encrypted by the vault (a key id and a ciphertext column): their re-encryption swap."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Column, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .engine import Database


async def swap_sealed(
    db: Database,
    key_id_column: Column[Any],
    ciphertext_column: Column[Any],
    row_id: str,
    *,
    old: tuple[str, bytes],
    new: tuple[str, bytes],
    also: Mapping[str, Any] | None = None,
    conn: AsyncConnection | None,
) -> bool:
    """Put `new` (key id, ciphertext) in place of a row's encrypted value if the row still holds `old`: a change
    made elsewhere meanwhile wins, and the answer is False. Nothing else of the row changes but the columns `also`
    names, in the same statement."""
    table = key_id_column.table
    statement = (
        update(table)
        .where(table.c.id == row_id, key_id_column == old[0], ciphertext_column == old[1])
        .values({key_id_column.name: new[0], ciphertext_column.name: new[1], **(also or {})})
    )
    async with db.write(conn) as c:
        return (await c.execute(statement)).rowcount == 1
