"""The event bus of one process: tells whoever waits on an elicitation that it reached a terminal state, and
every listener about every event (`ElicitationEvent`, `GrantChanged`).

A waiter is one future, registered before the elicitation can change (`waiter()`), resolved by `publish` with the
event, or by its owner with None (e.g. the client connection closed). Changes made in this process are published
right after their commit; changes made by other processes arrive through `OutboxFeed`, one query per interval for
all waiters. Listeners hear every event (e.g. to send `elicitation/complete`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from service.core.events import ElicitationEvent, Event

log = logging.getLogger("service.events")

Listener = Callable[[Event], None]
CatchUp = Callable[[], Awaitable[Any]]
Waiter = asyncio.Future[ElicitationEvent | None]


class LocalBus:
    """In-process fan-out: one future per waiter on an elicitation, and listeners for every event."""

    def __init__(self) -> None:
        # One future, or a list when several wait on the same elicitation: most elicitations have one waiter.
        self._waiters: dict[str, Waiter | list[Waiter]] = {}
        self._listeners: list[Listener] = []
        # What a bus across processes runs when it may have missed something (in one process nothing is missed):
        # the reader of the event log (news announced, or a reconnect), and the other catch-ups after a reconnect.
        self.log_reader: CatchUp | None = None
        # Takes an event of the log heard whole, when it is the next one after the reader's cursor (else False).
        self.log_follower: Callable[[ElicitationEvent], bool] | None = None
        self.reconnect_hooks: list[CatchUp] = []

    def add_listener(self, listener: Listener) -> None:
        """Called synchronously for every event; a listener that needs I/O schedules a task."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def read_log_with(self, reader: CatchUp, follower: Callable[[ElicitationEvent], bool] | None = None) -> None:
        """`reader` reads the event log when another process announces news in it, and after a reconnect;
        `follower` takes an announced event that is the next in the log without reading it (False: read)."""
        self.log_reader = reader
        self.log_follower = follower

    def after_reconnect(self, hook: CatchUp) -> None:
        """`hook` runs after a reconnect, once the event log is read (e.g. the replica's untold completions)."""
        self.reconnect_hooks.append(hook)

    def waiting(self) -> int:
        """How many elicitations someone in this process waits on."""
        return len(self._waiters)

    def publish(self, event: Event) -> None:
        """Tell this process's waiters and listeners (a bus across processes tells the others too)."""
        self.dispatch(event)

    def dispatch(self, event: Event) -> None:
        """Tell this process's waiters and listeners only (an event that came from elsewhere)."""
        if isinstance(event, ElicitationEvent):
            entry = self._waiters.pop(event.elicitation_id, None)
            for future in entry if isinstance(entry, list) else (entry,) if entry is not None else ():
                if not future.done():
                    future.set_result(event)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("event listener failed")

    async def start(self) -> None:
        """Nothing to start in one process."""

    async def close(self) -> None:
        """Nothing to close in one process."""

    def waiter(self, elicitation_id: str) -> Waiting:
        """`with bus.waiter(id) as future:` a future resolved with the elicitation's terminal event, registered
        until the block ends. Register it before the change can happen."""
        return Waiting(self, elicitation_id)

    def _register(self, elicitation_id: str) -> Waiter:
        future: Waiter = asyncio.get_running_loop().create_future()
        entry = self._waiters.get(elicitation_id)
        if entry is None:
            self._waiters[elicitation_id] = future
        elif isinstance(entry, list):
            entry.append(future)
        else:
            self._waiters[elicitation_id] = [entry, future]
        return future

    def _forget(self, elicitation_id: str, future: Waiter) -> None:
        entry = self._waiters.get(elicitation_id)
        if entry is future:
            del self._waiters[elicitation_id]
        elif isinstance(entry, list) and future in entry:
            entry.remove(future)
            if not entry:
                del self._waiters[elicitation_id]
        if not future.done():
            future.cancel()


class Waiting:
    """One registered waiter (a small object: a process may hold many thousands while they wait)."""

    __slots__ = ("_bus", "_elicitation_id", "_future")

    def __init__(self, bus: LocalBus, elicitation_id: str) -> None:
        self._bus = bus
        self._elicitation_id = elicitation_id
        self._future: Waiter | None = None

    def __enter__(self) -> Waiter:
        self._future = self._bus._register(self._elicitation_id)
        return self._future

    def __exit__(self, *exc: object) -> None:
        if self._future is not None:
            self._bus._forget(self._elicitation_id, self._future)
