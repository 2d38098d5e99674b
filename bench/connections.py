"""What returning a connection costs: SQLAlchemy's own close against the store's (`service.store.engine.pooled`).

SQLAlchemy closes an `AsyncConnection` in a task of its own, shielded from cancellation; the store closes one whose
block ended normally in the caller's task. One process, the store's SQLite engines (`Database.from_url`), a
one-statement write transaction and a one-statement read, each way in turn (alternating batches), CPU per operation:
the event loop's thread (`time.thread_time`) and the whole process (SQLite's thread included). Also a one-statement
write with its COMMIT in the statement's trip (`Database.write_alone`) against the store's write (`begun`).

    .venv/bin/python -m bench.connections [--batches 9] [--per-batch 500]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlalchemy import text

from bench.harness import machine, median
from service.store.engine import Database, begun, pooled

INSERT = text("INSERT INTO scratch VALUES (1)")
READ = text("SELECT n FROM scratch WHERE rowid = 1")


async def main(batches: int, per_batch: int) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Database.from_url(f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}")
        async with begun(db.writer) as conn:
            await conn.execute(text("CREATE TABLE scratch (n INTEGER)"))

        async def write_library() -> None:
            async with db.writer.begin() as conn:
                await conn.execute(INSERT)

        async def write_store() -> None:
            async with begun(db.writer) as conn:
                await conn.execute(INSERT)

        async def write_alone() -> None:
            async with db.write_alone() as conn:
                await conn.execute(INSERT)

        async def read_library() -> None:
            async with db.reader.connect() as conn:
                await conn.execute(READ)

        async def read_store() -> None:
            async with pooled(db.reader) as conn:
                await conn.execute(READ)

        ways: dict[str, Callable[[], Awaitable[None]]] = {
            "write, library's close": write_library,
            "write, store's close": write_store,
            "write, COMMIT in the statement's trip (`write_alone`)": write_alone,
            "read, library's close": read_library,
            "read, store's close": read_store,
        }
        loop_us: dict[str, list[float]] = {name: [] for name in ways}
        process_us: dict[str, list[float]] = {name: [] for name in ways}
        for way in ways.values():  # warm up
            for _ in range(50):
                await way()
        for batch in range(batches):
            order = list(ways.items()) if batch % 2 == 0 else list(reversed(ways.items()))
            for name, way in order:
                thread, process = time.thread_time(), time.process_time()
                for _ in range(per_batch):
                    await way()
                loop_us[name].append((time.thread_time() - thread) / per_batch * 1e6)
                process_us[name].append((time.process_time() - process) / per_batch * 1e6)
        await db.dispose()
    rows = [
        f"Measured on: {machine()}",
        "",
        f"| operation ({batches} alternating batches of {per_batch}, medians) | event loop's thread, us "
        "| process, us |",
        "|---|---|---|",
    ]
    for name in ways:
        rows.append(f"| {name} | {median(loop_us[name]):.1f} | {median(process_us[name]):.1f} |")
    for kind in ("write", "read"):
        library, store = f"{kind}, library's close", f"{kind}, store's close"
        rows.append(
            f"| {kind}: store / library | {median(loop_us[store]) / median(loop_us[library]):.3f}x "
            f"| {median(process_us[store]) / median(process_us[library]):.3f}x |"
        )
    alone, store = "write, COMMIT in the statement's trip (`write_alone`)", "write, store's close"
    rows.append(
        f"| write: COMMIT in the statement's trip / its own trip | "
        f"{median(loop_us[alone]) / median(loop_us[store]):.3f}x "
        f"| {median(process_us[alone]) / median(process_us[store]):.3f}x |"
    )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=9)
    parser.add_argument("--per-batch", type=int, default=500)
    args = parser.parse_args()
    print("\n".join(asyncio.run(main(args.batches, args.per_batch))))
