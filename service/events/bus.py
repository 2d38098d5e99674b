"""The event bus: tells whoever waits on an elicitation that it reached a terminal state, and every listener
about every event (`ElicitationEvent`, `GrantChanged`).

In one process this is an in-memory fan-out. Waiters must also re-read the database (the bus is a
wake-up call, not the source of truth), so a missed event costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from service.core.events import ElicitationEvent, Event

Listener = Callable[[Event], None]


class LocalBus:
    """In-process fan-out: per-elicitation queues for elicitation events, and listeners for every event."""

    def __init__(self) -> None:
        self._waiters: defaultdict[str, set[asyncio.Queue[ElicitationEvent]]] = defaultdict(set)
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        """Called synchronously for every event; a listener that needs I/O schedules a task."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def publish(self, event: Event) -> None:
        if isinstance(event, ElicitationEvent):
            for queue in list(self._waiters.get(event.elicitation_id, ())):
                queue.put_nowait(event)
        for listener in list(self._listeners):
            listener(event)

    @asynccontextmanager
    async def subscribe(self, elicitation_id: str) -> AsyncIterator[asyncio.Queue[ElicitationEvent]]:
        queue: asyncio.Queue[ElicitationEvent] = asyncio.Queue()
        self._waiters[elicitation_id].add(queue)
        try:
            yield queue
        finally:
            waiters = self._waiters.get(elicitation_id)
            if waiters is not None:
                waiters.discard(queue)
                if not waiters:
                    del self._waiters[elicitation_id]
