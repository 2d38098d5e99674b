"""`LocalMovingWindow`: moving-window rate limits counted in this process, for `rate_limit.storage_url = memory://`.

It counts as the `limits` library's `MovingWindowRateLimiter` over its in-memory storage does (same items, same
answers: a hit is refused when `item.amount` hits fall in the last `item.get_expiry()` seconds; the window's
reset is its oldest counted hit plus the window), without what that storage costs a long-running process: an
`asyncio.Lock` and a namespaced key string per key, an object per hit, and an expiry task that walks every key
(a thread hop each) after every hit and leaves a key until then. Here a key is a tuple, its hits a list of
floats trimmed at each hit (a deque would take a 64-slot block for the one or two hits most keys see), and keys
are kept in the order of their last counted hit, so that the keys whose window has passed are dropped from the
front as the next hit arrives, or by one timer when the least recently counted key's window ends (so that an idle
process returns to what it held before): nothing of a finished flow stays much longer than its window. Nothing
awaits between reading a key and counting into it, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import Callable

from limits import RateLimitItem, WindowStats

SWEEP_MARGIN_SECONDS = 0.5
Key = tuple[int, int, tuple[str, ...]]  # (amount, window seconds, identifiers)


class LocalMovingWindow:
    """The `hit` and `get_window_stats` of limits' `MovingWindowRateLimiter`, kept in one process."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._hits: OrderedDict[Key, list[float]] = OrderedDict()  # by last counted hit, the oldest first
        self._clock = clock
        self._sweep: asyncio.TimerHandle | None = None  # set while keys are held

    def __len__(self) -> int:
        """The keys held (those with a hit in their window, and any not yet dropped by a hit or the sweep)."""
        return len(self._hits)

    async def hit(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        """Count `cost` hits for `identifiers` unless that would exceed `item`'s amount in its window."""
        now = self._clock()
        self._drop_passed(now)
        expiry = item.get_expiry()
        if cost > item.amount:
            return False
        key: Key = (item.amount, expiry, identifiers)
        hits = self._hits.get(key)
        if hits is None:
            self._hits[key] = [now] * cost
            if self._sweep is None:
                self._schedule(now)
            return True
        _trim(hits, now - expiry)
        if len(hits) + cost > item.amount:
            return False
        hits.extend([now] * cost)
        self._hits.move_to_end(key)
        return True

    async def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        """When the window of `identifiers` has room again (its oldest counted hit plus the window) and how much."""
        now = self._clock()
        expiry = item.get_expiry()
        hits = self._hits.get((item.amount, expiry, identifiers))
        if hits:
            _trim(hits, now - expiry)
        if not hits:
            return WindowStats(now + expiry, item.amount)
        return WindowStats(hits[0] + expiry, max(0, item.amount - len(hits)))

    def _drop_passed(self, now: float) -> None:
        """Drop the keys whose last counted hit is out of its window, from the front (least recently counted)."""
        hits = self._hits
        while hits:
            key, times = next(iter(hits.items()))
            if times and times[-1] >= now - key[1]:
                return
            hits.popitem(last=False)

    def _schedule(self, now: float) -> None:
        """Wake when the front key's window ends (a little after, so that it has passed), if any key is held."""
        if not self._hits:
            return
        key, times = next(iter(self._hits.items()))
        delay = max(0.0, times[-1] + key[1] - now) + SWEEP_MARGIN_SECONDS
        self._sweep = asyncio.get_running_loop().call_later(delay, self._on_sweep)

    def _on_sweep(self) -> None:
        self._sweep = None
        now = self._clock()
        self._drop_passed(now)
        self._schedule(now)


def _trim(hits: list[float], cutoff: float) -> None:
    """Forget the hits before `cutoff` (a hit at `cutoff` itself still counts, as in limits)."""
    if hits and hits[0] < cutoff:
        del hits[: bisect.bisect_left(hits, cutoff)]
