"""Keyset paging: a page of rows and the opaque cursor of the row after which the next page starts.

A cursor is the sort key of a page's last row, `(time, id)`, written as base64url JSON. Lists are never paged by
offset: with a million rows, page 1,000 costs what page 1 costs. A cursor that cannot be read is `invalid_input`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from .errors import FlowRefused

T = TypeVar("T")

MAX_CURSOR = 256


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page ends: the last row's time and id (ids break ties between rows of one instant)."""

    at: datetime
    id: str

    def encode(self) -> str:
        raw = json.dumps([self.at.isoformat(), self.id], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    @classmethod
    def decode(cls, cursor: str | None) -> Position | None:
        """The position a cursor names; None for none; `FlowRefused("invalid_input")` for one unreadable."""
        if not cursor:
            return None
        try:
            if len(cursor) > MAX_CURSOR:
                raise ValueError("too long")
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            at, id_ = json.loads(raw)
            when = datetime.fromisoformat(at)
            if when.tzinfo is None or not isinstance(id_, str | int):
                raise ValueError("not a position")
            return cls(when, str(id_))
        except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
            raise FlowRefused("invalid_input", detail={"problem": "the paging cursor (after) cannot be read"}) from None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """Up to `limit` rows in order, and the cursor of the next page (None on the last page)."""

    items: Sequence[T]
    next: str | None = None

    @classmethod
    def of(cls, rows: Sequence[T], limit: int, key: Callable[[T], Position]) -> Page[T]:
        """Rows read with `limit + 1`: the extra row only tells that another page follows, after the last kept."""
        if len(rows) > limit:
            kept = rows[:limit]
            return cls(kept, key(kept[-1]).encode())
        return cls(rows)
