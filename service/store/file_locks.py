"""A grant's refresh lock across the processes that share one SQLite file: an exclusive `flock` on a lock file.

PostgreSQL locks the grant's row for the length of a refresh (`GrantRepository.locked_for_refresh`); SQLite holds
nothing open across the provider call, and one serving process is single-flight by its own per-grant lock. But
another process on the same file (an operator command such as `grants migrate`, or a second process an operator
runs) would call the provider for the same grant at the same time: with single-use refresh tokens or a one-time
token exchange, only one of the answers may be stored. So on a SQLite file each refresh also holds an exclusive
lock on one of `BUCKETS` files in `<database file>.locks/` (created with mode 0700 at first use), chosen by the
grant's id: grants that share a bucket wait for each other only while one is being refreshed. A lock dies with its
process (a killed command holds nothing). Waiting polls, so no thread is tied up; after `timeout` seconds it gives
up (`TimeoutError`), as PostgreSQL's lock_timeout does.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: SQLite serves one process there, nothing to share
    fcntl = None  # type: ignore[assignment]

BUCKETS = 64
_FIRST_POLL = 0.002
_LONGEST_POLL = 0.05


class FileLocks:
    """Exclusive locks by key, held by whole processes on one machine (see the module's doc)."""

    def __init__(self, directory: Path, timeout: float) -> None:
        self.directory = directory
        self.timeout = timeout

    @classmethod
    def beside(cls, database: str | None, timeout: float) -> FileLocks | None:
        """The locks of the SQLite database file `database` (None for an in-memory database or without flock)."""
        if fcntl is None or not database or database == ":memory:" or database.startswith("file::memory:"):
            return None
        return cls(Path(database).with_name(Path(database).name + ".locks"), timeout)

    def _path(self, key: str) -> Path:
        bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % BUCKETS
        return self.directory / f"{bucket:02d}.lock"

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold the lock of `key` for the block (TimeoutError when another process keeps it past `timeout`)."""
        assert fcntl is not None
        self.directory.mkdir(mode=0o700, exist_ok=True)
        descriptor = os.open(self._path(key), os.O_RDWR | os.O_CREAT, 0o600)
        try:  # each open is its own open file description: it excludes other tasks of this process too
            deadline, wait = time.monotonic() + self.timeout, _FIRST_POLL
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"lock {key!r} held elsewhere for {self.timeout:.0f} s") from None
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, _LONGEST_POLL)
            yield
        finally:
            os.close(descriptor)  # releases the lock
