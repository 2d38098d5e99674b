"""Two processes writing one SQLite file through the store's one-trip writer (`sqlite_driver`): each write transaction
takes the write lock with its first statement (`BEGIN IMMEDIATE` in that statement's trip), so the other process's
writes wait on `busy_timeout` instead of failing with "database is locked", and no read-then-write loses an update;
the same for a transaction whose last statement carries its COMMIT and for a write whose statements are each their
own transaction."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path

ROUNDS = 60
WRITERS = ("first", "second")
REPO = Path(__file__).resolve().parent.parent


async def test_two_processes_writing_one_file_lose_nothing_and_never_meet_a_locked_database(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        setup.execute("INSERT INTO counter VALUES (1, 0)")
        setup.execute("CREATE TABLE writes (writer TEXT, round INTEGER, kind TEXT, UNIQUE (writer, round, kind))")
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.sqlite_writer",
            str(path),
            name,
            str(ROUNDS),
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for name in WRITERS
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert (await asyncio.wait_for(process.stdout.readline(), 60)).strip() == b"ready"
        for process in processes:  # both at once
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            await process.stdin.drain()
        outputs = [await asyncio.wait_for(process.communicate(), 120) for process in processes]
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert [process.returncode for process in processes] == [0, 0]
    assert [json.loads(stdout.splitlines()[-1]) for stdout, _ in outputs] == [{"errors": {}}] * len(WRITERS)
    with sqlite3.connect(path) as check:
        counted = check.execute("SELECT n FROM counter").fetchone()[0]
        written = check.execute("SELECT count(*) FROM writes").fetchone()[0]
        integrity = check.execute("PRAGMA integrity_check").fetchone()[0]
    assert written == len(WRITERS) * ROUNDS * 3  # every write of both processes, once (UNIQUE)
    assert counted == written  # no read-then-write lost the other process's increment
    assert integrity == "ok"
