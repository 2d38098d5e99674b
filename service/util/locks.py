"""`KeyedLocks`: one asyncio lock per key, existing only while someone holds or waits for it.

A plain `dict[key, Lock]` grows with every key ever used (every grant, every session); this one removes a key's
lock when its last user leaves, so it holds only the keys in use right now.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class KeyedLocks(Generic[K]):
    def __init__(self) -> None:
        self._entries: dict[K, _Entry] = {}

    @asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
        """Hold `key`'s lock for the block (one holder per key at a time)."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]

    def __len__(self) -> int:
        """How many keys have a lock now (held or waited for)."""
        return len(self._entries)
