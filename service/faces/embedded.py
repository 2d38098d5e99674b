"""The `Lifecycle` port in process, for every face: the embedded connector's elicitations, on its store and bus.

Completions are told once across replicas: the process holding the connection takes the telling by a conditional
update (`claim_completion`), whoever asks again (the waiting call, a duplicate event, a catch-up).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import replace

from service.core.answers import ClientAnswer
from service.core.events import ElicitationEvent, Event
from service.core.lifecycle import Elicitations
from service.core.outcomes import AuthorizationOutcome, StopCause
from service.core.ports import EventSource
from service.core.records import ElicitationRecord
from service.core.states import ElicitationStatus
from service.metrics import CompletionResult, Metrics

from .lifecycle import AuthorizationAsk, CompletionListener

log = logging.getLogger("service.faces")


class EmbeddedLifecycle:
    """`Lifecycle[ElicitationRecord, ElicitationEvent]` over `Elicitations` and the event bus of this process."""

    def __init__(self, elicitations: Elicitations, events: EventSource, metrics: Metrics | None = None) -> None:
        self.elicitations = elicitations
        self.events = events
        self.metrics = metrics or Metrics()
        # This process among the replicas sharing the database: the one that tells the completions of the
        # connections it holds.
        self.replica_id = elicitations.replica_id

    def display_name(self, provider: str) -> str:
        return self.elicitations.display_name(provider)

    async def settled(self, ask: AuthorizationAsk) -> AuthorizationOutcome | None:
        return await self.elicitations.settled(
            ask.user,
            ask.provider,
            ask.scopes or (),
            ask_again=ask.ask_again,
            connection=ask.connection,
            account=ask.account,
            seen=ask.seen,
        )

    async def unsupported(self, ask: AuthorizationAsk) -> None:
        await self.elicitations.unsupported_client(ask.user, ask.provider)

    async def create(self, ask: AuthorizationAsk, connection_key: str) -> ElicitationRecord:
        return await self.elicitations.create(
            connection_key=connection_key,
            user=ask.user,
            provider=ask.provider,
            scopes=ask.scopes or (),
            scope=ask.scope,
            message=ask.message,
            replica_id=self.replica_id,
            connection=ask.connection,
            account=ask.account,
            seen=ask.seen,
        )

    def url(self, handle: ElicitationRecord) -> str:
        return self.elicitations.connect_url(handle.id)

    def waiter(self, handle: ElicitationRecord) -> AbstractContextManager[asyncio.Future[ElicitationEvent | None]]:
        return self.events.waiter(handle.id)

    async def answered(self, handle: ElicitationRecord, answer: ClientAnswer) -> AuthorizationOutcome | None:
        return await self.elicitations.answered(handle, answer)

    def kept(self, handle: ElicitationRecord) -> ElicitationRecord:
        return replace(handle, message="")

    async def outcome_of_end(self, handle: ElicitationRecord, end: ElicitationEvent) -> AuthorizationOutcome:
        return await self.elicitations.outcome_of_event(handle, end)

    async def cancel(
        self, handle: ElicitationRecord, cause: StopCause, *, request_cancelled: bool | None = None
    ) -> bool:
        return await self.elicitations.cancel(handle, cause, request_cancelled=request_cancelled)

    async def current_outcome(self, handle: ElicitationRecord) -> AuthorizationOutcome:
        return await self.elicitations.outcome(await self.elicitations.get(handle.id) or handle)

    def on_completed(self, listener: CompletionListener) -> None:
        def heard(event: Event) -> None:
            if isinstance(event, ElicitationEvent) and event.status is ElicitationStatus.COMPLETED:
                listener(event.elicitation_id, event.connection_key, event.replica_id == self.replica_id)

        self.events.add_listener(heard)

    async def tell_completion(self, elicitation_id: str, send: Callable[[], Awaitable[bool]]) -> None:
        """The database decides, by a conditional update, whatever repeats the event (a duplicate, a catch-up
        after a reconnect, the waiting call); without a live connection the completion is recorded undeliverable."""
        try:
            completed_at = await self.elicitations.claim_telling(elicitation_id)
            if completed_at is None:
                return  # told already, or settled by another replica
            sent = await send()
            settled = await self.elicitations.settle_telling(elicitation_id, sent=sent)
        except Exception as exc:  # this replica's heartbeat catch-up tries an untold completion again
            log.warning("telling a completion failed: %s", type(exc).__name__, extra={"elicitation_id": elicitation_id})
            return
        if not settled:
            log.warning(
                "a completion was settled undeliverable while this replica was telling it (presumed gone)",
                extra={"elicitation_id": elicitation_id},
            )
        since = (self.elicitations.now() - completed_at).total_seconds() if sent else None
        self.metrics.completion(CompletionResult.SENT if sent else CompletionResult.UNDELIVERABLE, since)
