"""`Bounded`: a dict that keeps at most `limit` keys, dropping the oldest set when a new one would exceed it.

For caches keyed by something that keeps coming (a grant, a user): a plain dict would keep an entry for every key
ever seen for as long as the process lives. What falls out is read again from where it came from.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Bounded(OrderedDict[K, V]):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        if len(self) > self.limit:
            self.popitem(last=False)
