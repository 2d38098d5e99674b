"""The server's shutdown, as the app sees it: one `Draining` per app, set when the server starts to stop.

Long-lived responses (the event stream) wait on it beside their own work and end cleanly when it is set, so a
server told to stop (SIGTERM) finishes within its grace period instead of waiting for clients that never leave.
"""

from __future__ import annotations

import asyncio


class Draining:
    def __init__(self) -> None:
        self._started: asyncio.Event | None = None  # made on first use, inside the loop that serves

    def _event(self) -> asyncio.Event:
        if self._started is None:
            self._started = asyncio.Event()
        return self._started

    def start(self) -> None:
        """The server stops accepting and asks open responses to end."""
        self._event().set()

    @property
    def started(self) -> bool:
        return self._started is not None and self._started.is_set()

    async def wait(self) -> None:
        await self._event().wait()
