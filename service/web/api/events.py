"""`GET /v1/events`: Server-Sent Events of the caller's elicitations and of the grants it sees (its tenant's, and
those shared with it), read from the durable event log.

Each terminal change of an elicitation (SSE `event: elicitation`) and each change of a grant's health that agents
are told about (`event: grant`: `grant.needs_user`, `grant.recovered`, `grant.revoked`, `grant.deleted`) is one
event whose SSE `id` is its id in the log (`elicitation_events`, ordered by commit), so
a client that reconnects with `Last-Event-ID` (or `?after=`) gets every later event exactly once, whichever replica
made the change or serves the stream. Without either, the stream starts at the newest event. Every stream opens
with a `ready` event carrying the position it starts from as its `id` (and empty data: an id-only frame would not
move the last event id of clients whose parser drops frames without data), so a client that sees no event before it
reconnects resumes from there and an event logged while it reconnects still reaches it. Events carry ids, statuses
and reason codes only.

The stream reads the log when this process's bus hears an event (its own changes, and other replicas' when the bus
carries them), and at least every `POLL_SECONDS`. After `api.events_keepalive_seconds` in which it sent nothing
itself (other tenants' events do not count) it sends a comment, so proxies keep an idle stream open. When the
server starts to stop (`Draining`) every stream sends a last comment and ends, so the server exits within its grace
period.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from service.core.agent_api import AgentApi
from service.core.events import ElicitationEvent, GrantEvent, LoggedEvent
from service.core.records import ApiKeyRecord
from service.core.webhooks import event_body, for_tenant
from service.events import LocalBus

from ..draining import Draining
from ..inputs import invalid
from .io import caller, query_text

POLL_SECONDS = 1.0
BATCH = 200
RETRY_MILLISECONDS = 2000


class EventStream:
    def __init__(self, api: AgentApi, bus: LocalBus, draining: Draining, *, keepalive_seconds: float) -> None:
        self.api = api
        self.bus = bus
        self.draining = draining
        self.keepalive_seconds = keepalive_seconds

    async def handle(self, request: Request) -> Response:
        key = await caller(request, self.api)
        given = request.headers.get("last-event-id") or query_text(request, "after")
        if given is None:
            start = await self.api.store.outbox.last_id()
        elif given.isdigit() and len(given) <= 19:
            start = int(given)
        else:
            raise invalid("Last-Event-ID must be an event id")
        return StreamingResponse(
            self._stream(key, start),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _stream(self, key: ApiKeyRecord, last: int) -> AsyncIterator[bytes]:
        wake = asyncio.Event()

        def heard(event: object) -> None:
            if isinstance(event, ElicitationEvent | GrantEvent):
                wake.set()

        self.bus.add_listener(heard)
        loop = asyncio.get_running_loop()
        draining: asyncio.Future[None] = asyncio.ensure_future(self.draining.wait())
        try:
            yield f"retry: {RETRY_MILLISECONDS}\nid: {last}\nevent: ready\ndata:\n\n".encode()
            sent_at = loop.time()
            while not self.draining.started:
                wake.clear()
                events = await _unless_cancelled(self.api.store.outbox.after(last, limit=BATCH))
                for event in events:
                    last = max(last, event.id or 0)
                    if for_tenant(event, key.tenant, self.api.elicitations.sharing) and _allowed(event, key):
                        sent_at = loop.time()
                        yield frame(event)
                if len(events) == BATCH:
                    continue
                quiet_left = self.keepalive_seconds - (loop.time() - sent_at)
                await _first_of(wake, draining, seconds=min(POLL_SECONDS, max(quiet_left, 0)))
                if not self.draining.started and loop.time() - sent_at >= self.keepalive_seconds:
                    sent_at = loop.time()
                    yield b": keep-alive\n\n"
            yield b": the server is shutting down; reconnect with Last-Event-ID\n\n"
        finally:
            draining.cancel()
            self.bus.remove_listener(heard)


def _allowed(event: LoggedEvent, key: ApiKeyRecord) -> bool:
    """A grant event only for a key that may use its provider (its elicitations are its own already)."""
    return not isinstance(event, GrantEvent) or key.allows(event.provider)


def frame(event: LoggedEvent) -> bytes:
    """One SSE frame; its data is the same JSON a webhook sends (`models.Event`, `models.GrantEventBody`)."""
    kind = "grant" if isinstance(event, GrantEvent) else "elicitation"
    return f"id: {event.id or 0}\nevent: {kind}\ndata: {event_body(event)}\n\n".encode()


async def _first_of(wake: asyncio.Event, draining: asyncio.Future[None], *, seconds: float) -> None:
    """Until `wake` is set, the server starts to stop, or `seconds` pass."""
    woken = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait((woken, draining), timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()


async def _unless_cancelled(read: Awaitable[list[LoggedEvent]]) -> list[LoggedEvent]:
    """`read`'s result; a stream cancelled meanwhile (its client left) lets the statement finish in the background
    instead of cancelling it mid-flight, which would cost the database connection it runs on."""
    task = asyncio.ensure_future(read)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_consume)
        raise


def _consume(task: asyncio.Future[list[LoggedEvent]]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a failed read after its stream ended is nobody's to report
