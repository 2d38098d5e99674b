"""One process writing to a shared SQLite file through the store's writer: `python -m tests.sqlite_writer PATH NAME
ROUNDS`.

Prints `ready` once its writer is connected, waits for a line `go` on stdin, then makes ROUNDS rounds of the three
kinds of one-trip write (`sqlite_driver`), each a read of a shared counter followed by its increment (a lost update
if the write lock were not taken with the transaction's first statement), and each leaving a row naming it:
- `write`: a transaction of the usual kind (`Database.write`), its COMMIT a trip of its own;
- `last`: a transaction whose last statement carries its COMMIT (`commit_with_rows`);
- `alone`: statements that are each their own transaction (`Database.write_alone`), the increment one statement.
Prints one JSON line: {"errors": {"OperationalError": n, ...}}. Used by tests/test_sqlite_processes.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

from sqlalchemy import text

from service.store.engine import Database, PoolSettings, commit_with_rows

READ = text("SELECT n FROM counter WHERE id = 1")
SET = text("UPDATE counter SET n = :n WHERE id = 1 RETURNING n")
LOGGED = text("INSERT INTO writes (writer, round, kind) VALUES (:writer, :round, :kind)")


async def write(db: Database, name: str, round: int, kind: str) -> None:
    logged = {"writer": name, "round": round, "kind": kind}
    if kind == "alone":
        async with db.write_alone() as conn:
            await conn.execute(text("UPDATE counter SET n = n + 1 WHERE id = 1"))
            await conn.execute(LOGGED, logged)
        return
    async with db.write() as conn:
        n = (await conn.execute(READ)).scalar_one()
        await conn.execute(LOGGED, logged)
        if kind == "last":
            commit_with_rows(conn)
        await conn.execute(SET, {"n": n + 1})


async def run(path: str, name: str, rounds: int) -> dict[str, dict[str, int]]:
    db = Database.from_url(f"sqlite+aiosqlite:///{path}", PoolSettings(size=2, overflow=0, timeout=30))
    errors: Counter[str] = Counter()
    try:
        async with db.write() as conn:
            await conn.execute(READ)
        print("ready", flush=True)
        if (await asyncio.to_thread(sys.stdin.readline)).strip() != "go":
            raise SystemExit("expected `go` on stdin")
        for round in range(rounds):
            for kind in ("write", "last", "alone"):
                try:
                    await write(db, name, round, kind)
                except Exception as exc:  # counted by kind: the test expects none
                    errors[type(exc).__name__] += 1
    finally:
        await db.dispose()
    return {"errors": dict(errors)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(sys.argv[1], sys.argv[2], int(sys.argv[3])))), flush=True)
