"""The time one connector reads everywhere, as one object, so that tests (and nothing else) can move it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Clock:
    def __init__(self) -> None:
        self._offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self._offset

    def advance(self, delta: timedelta) -> None:
        """Move this connector's time forward by `delta` (for tests of expiry)."""
        self._offset += delta
