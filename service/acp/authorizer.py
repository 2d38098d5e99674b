"""Getting a user's authorization over one ACP connection, and telling that connection when it is done.

`AcpAuthorizer` owns the connector's view of its client connections (`AcpLink`s), foreground state per session,
and the delivery of `elicitation/complete` to the connection that asked. `request_authorization` runs one
elicitation: create it, send `elicitation/create`, record the answer, wait for the browser, and end it honestly
when the work is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from service.core.events import ElicitationEvent, Event
from service.core.identity import Identity
from service.core.lifecycle import AnswerKind, Elicitations
from service.core.outcomes import AuthorizationOutcome, AuthorizationStatus, GrantInfo
from service.core.ports import EventSource
from service.core.records import ElicitationRecord
from service.core.scopes import ElicitationScope, SessionScope
from service.core.states import ElicitationStatus
from service.metrics import CompletionResult, Metrics

from .adapter import AgentConnection
from .capabilities import url_mode_advertised
from .foreground import ForegroundTracker
from .link import AcpLink, StateListener
from .messages import send_completion, send_url_elicitation

log = logging.getLogger("service.acp")

# While waiting for the browser, re-read the database this often: the bus is a wake-up call, not the truth.
POLL_SECONDS = 2.0


class AcpAuthorizer:
    def __init__(self, elicitations: Elicitations, events: EventSource, metrics: Metrics | None = None) -> None:
        self.elicitations = elicitations
        self.events = events
        self.metrics = metrics or Metrics()
        self.foreground = ForegroundTracker()
        self._links: weakref.WeakKeyDictionary[Any, AcpLink] = weakref.WeakKeyDictionary()
        self._links_by_key: weakref.WeakValueDictionary[str, AcpLink] = weakref.WeakValueDictionary()
        self._deliveries: dict[str, asyncio.Task[None]] = {}
        events.add_listener(self._on_event)

    def now(self) -> datetime:
        return self.elicitations.now()

    async def close(self) -> None:
        await asyncio.gather(*list(self._deliveries.values()), return_exceptions=True)

    def attach(self, conn: AgentConnection, *, on_state: StateListener | None = None) -> AcpLink:
        link = self._links.get(conn)
        if link is None:
            link = AcpLink(conn)
            self._links[conn] = link
            self._links_by_key[link.key] = link
        self.foreground.listen(link, on_state)
        return link

    async def request_authorization(
        self,
        conn: AgentConnection,
        client_capabilities: Any,
        *,
        user: Identity,
        provider: str,
        scopes: Sequence[str],
        scope: ElicitationScope,
        message: str | None,
        foreground: bool,
    ) -> AuthorizationOutcome:
        existing = await self.elicitations.find_grant(user, provider, scopes)
        if existing is not None:
            return AuthorizationOutcome(
                AuthorizationStatus.ALREADY_AUTHORIZED,
                provider,
                grant=GrantInfo.of(existing),
                provider_display_name=self.elicitations.providers.display_name(provider),
            )
        link = self.attach(conn)
        capabilities: Mapping[str, Any] | Any = client_capabilities
        if link.initialize_params is not None:
            capabilities = link.raw_capabilities
        if not url_mode_advertised(capabilities):
            await self.elicitations.store.audit.record(
                "unsupported_client", identity=user, provider=provider, now=self.now()
            )
            return AuthorizationOutcome(
                AuthorizationStatus.UNSUPPORTED,
                provider,
                provider_display_name=self.elicitations.providers.display_name(provider),
            )

        record = await self.elicitations.create(
            connection_key=link.key, user=user, provider=provider, scopes=scopes, scope=scope, message=message
        )
        blocking = foreground and isinstance(scope, SessionScope)
        session_id = scope.session_id if isinstance(scope, SessionScope) else ""
        if blocking:
            await self.foreground.block(link, session_id)
        cancelled = False
        try:
            async with self.events.subscribe(record.id) as events:
                answer = await send_url_elicitation(
                    conn,
                    elicitation_id=record.id,
                    url=self.elicitations.settings.connect_url(record.id),
                    message=record.message,
                    scope=scope,
                )
                if answer.kind is AnswerKind.ACCEPT:
                    await self.elicitations.consented(record)
                    return await self._await_browser(link, record, events)
                outcome = await self.elicitations.answered(record, answer)
                assert outcome is not None
                return await self._delivered(outcome)
        except asyncio.CancelledError:
            cancelled = True
            await self._cancelled(link, record)
            raise
        finally:
            if blocking:
                # The work resumes (`running`) with whatever outcome, or ends without resuming (`idle`).
                await self.foreground.unblock(link, session_id, ended=cancelled)

    async def _cancelled(self, link: AcpLink, record: ElicitationRecord) -> None:
        """The work waiting on this elicitation was cancelled: cancel our request and end the elicitation.

        The browser flow may still finish on its own (the grant is then stored), but nothing resumes the
        cancelled work and no `elicitation/complete` is sent for it: the client was told to drop it.
        """
        request_id = link.pending_request_id(record.id)
        if request_id is not None:
            await link.cancel_request(request_id)
        await self.elicitations.finish(
            record,
            ElicitationStatus.CANCELLED,
            "cancelled",
            reason="the agent's work was cancelled",
            detail={"request_cancelled": request_id is not None},
            close_flows=False,
        )

    async def _await_browser(
        self, link: AcpLink, record: ElicitationRecord, events: asyncio.Queue[ElicitationEvent]
    ) -> AuthorizationOutcome:
        while True:
            current = await self.elicitations.get(record.id)
            if current is None:  # pragma: no cover - rows are never deleted while waited on
                return self.elicitations.outcome_of(record, AuthorizationStatus.FAILED, reason="lost")
            if current.status.terminal:
                return await self._delivered(await self.elicitations.outcome(current))
            remaining = (current.expires_at - self.now()).total_seconds()
            if remaining <= 0:
                await self.elicitations.finish(
                    current, ElicitationStatus.EXPIRED, "expired", reason="expired while waiting"
                )
                continue
            if link.closed():
                # The user may still be in the browser: the elicitation stays open and a grant that arrives
                # later is stored. Only the notification has nowhere to go.
                await self.elicitations.audit(record, "disconnected")
                return self.elicitations.outcome_of(
                    record, AuthorizationStatus.DISCONNECTED, reason="client connection closed"
                )
            try:
                await asyncio.wait_for(events.get(), timeout=min(POLL_SECONDS, remaining))
            except TimeoutError:
                pass

    async def _delivered(self, outcome: AuthorizationOutcome) -> AuthorizationOutcome:
        """Let `elicitation/complete` reach the client before the waiting work resumes."""
        if outcome.status is AuthorizationStatus.AUTHORIZED and outcome.elicitation_id is not None:
            delivery = self._deliveries.get(outcome.elicitation_id)
            if delivery is not None:
                await asyncio.shield(delivery)
        return outcome

    def _on_event(self, event: Event) -> None:
        if not isinstance(event, ElicitationEvent) or event.status is not ElicitationStatus.COMPLETED:
            return
        link = self._links_by_key.get(event.connection_key)
        if link is None:
            log.info(
                "originating connection is gone; elicitation/complete not sent",
                extra={"elicitation_id": event.elicitation_id},
            )
            return
        # Exactly once: only the single winning transition to COMPLETED publishes this event.
        task = asyncio.get_running_loop().create_task(self._deliver(link, event.elicitation_id))
        self._deliveries[event.elicitation_id] = task
        task.add_done_callback(lambda _t: self._deliveries.pop(event.elicitation_id, None))

    async def _deliver(self, link: AcpLink, elicitation_id: str) -> None:
        sent = await send_completion(link, elicitation_id)
        record = await self.elicitations.get(elicitation_id)
        since = (self.now() - record.updated_at).total_seconds() if record is not None else None
        self.metrics.completion(
            CompletionResult.SENT if sent else CompletionResult.UNDELIVERABLE, since if sent else None
        )
        await self.elicitations.store.audit.record(
            "completion_sent" if sent else "completion_undeliverable",
            elicitation_id=elicitation_id,
            now=self.now(),
        )
