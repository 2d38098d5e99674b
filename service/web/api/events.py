"""`GET /v1/events`: Server-Sent Events of the caller's elicitations and of grants, read from the durable event log.

Each terminal change of an elicitation (SSE `event: elicitation`) and each change of a grant's health that agents
are told about (`event: grant`: `grant.needs_user`, `grant.recovered`, `grant.revoked`, `grant.deleted`) is one
event whose SSE `id` is its id in the log (`elicitation_events`, ordered by commit), so
a client that reconnects with `Last-Event-ID` (or `?after=`) gets every later event exactly once, whichever replica
made the change or serves the stream. Without either, the stream starts at the newest event. Events carry ids,
statuses and reason codes only. The stream reads the log when this process's bus hears an event (its own changes,
and other replicas' when the bus carries them), and at least every `POLL_SECONDS`; it sends a comment every
`HEARTBEAT_SECONDS` of silence so proxies keep it open.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from service.core.agent_api import AgentApi
from service.core.events import ElicitationEvent, GrantEvent, LoggedEvent
from service.core.records import ApiKeyRecord
from service.core.webhooks import event_body, for_tenant
from service.events import LocalBus

from ..inputs import invalid
from .io import caller, query_text

POLL_SECONDS = 1.0
HEARTBEAT_SECONDS = 15.0
BATCH = 200
RETRY_MILLISECONDS = 2000


class EventStream:
    def __init__(self, api: AgentApi, bus: LocalBus) -> None:
        self.api = api
        self.bus = bus

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
        quiet_since = loop.time()
        try:
            yield f"retry: {RETRY_MILLISECONDS}\n\n".encode()
            while True:
                wake.clear()
                events = await self.api.store.outbox.after(last, limit=BATCH)
                for event in events:
                    last = max(last, event.id or 0)
                    if for_tenant(event, key.tenant) and _allowed(event, key):
                        yield frame(event)
                if len(events) == BATCH:
                    continue
                if events:
                    quiet_since = loop.time()
                try:
                    await asyncio.wait_for(wake.wait(), POLL_SECONDS)
                except TimeoutError:
                    pass
                if loop.time() - quiet_since >= HEARTBEAT_SECONDS:
                    quiet_since = loop.time()
                    yield b": keep-alive\n\n"
        finally:
            self.bus.remove_listener(heard)


def _allowed(event: LoggedEvent, key: ApiKeyRecord) -> bool:
    """A grant event only for a key that may use its provider (its elicitations are its own already)."""
    return not isinstance(event, GrantEvent) or key.allows(event.provider)


def frame(event: LoggedEvent) -> bytes:
    """One SSE frame; its data is the same JSON a webhook sends (`models.Event`, `models.GrantEventBody`)."""
    kind = "grant" if isinstance(event, GrantEvent) else "elicitation"
    return f"id: {event.id or 0}\nevent: {kind}\ndata: {event_body(event)}\n\n".encode()
