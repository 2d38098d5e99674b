"""Getting a user's authorization over one ACP connection, and telling that connection when it is done.

`AcpAuthorizer` owns the connector's view of its client connections (`AcpLink`s, dropped when a connection ends),
foreground state per session, and the delivery of `elicitation/complete` to the connection that asked.
`request_authorization` runs one elicitation: create it, send `elicitation/create`, record the answer, wait for the
browser, and end it honestly when anything stops it early. What goes on the wire then:

An early stop, and what the client receives after `requires_action` (in this order):

- the agent's own timeout or task cancellation: `$/cancel_request` for our unanswered `elicitation/create` (once),
  then `running` (the agent's code goes on);
- the client's `session/cancel`, or its `$/cancel_request` for the request being served: `$/cancel_request` for the
  unanswered create (once), then `idle` with stop reason `cancelled` (the work ends without resuming);
- the elicitation ends meanwhile (its TTL, an expiry sweeper, the browser finishing first): `$/cancel_request` for the
  unanswered create (once), then `running`;
- the connection ends: nothing (nobody to tell).

The row ends `cancelled` (`client_disconnected` when the connection ended), `expired`, or as it ended; a cancelled
elicitation resumes nothing, and a flow the user already took to the provider still stores its grant. Whoever ends
an elicitation elsewhere (e.g. an expiry sweeper) only ends the row; the waiting call here sends the wire messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from service.core.events import ElicitationEvent, Event
from service.core.identity import Identity
from service.core.lifecycle import AnswerKind, ClientAnswer, Elicitations
from service.core.outcomes import (
    CLIENT_DISCONNECTED,
    AuthorizationOutcome,
    AuthorizationStatus,
)
from service.core.ports import EventSource
from service.core.records import ElicitationRecord
from service.core.scopes import ElicitationScope, SessionScope
from service.core.states import ElicitationStatus
from service.metrics import CompletionResult, Metrics

from .adapter import AgentConnection, SdkConnection
from .capabilities import url_mode_advertised
from .foreground import ForegroundTracker
from .link import AcpLink, StateListener
from .messages import send_completion, send_url_elicitation
from .wire import serving

log = logging.getLogger("service.acp")

Waiter = asyncio.Future[ElicitationEvent | None]

# How long `request_authorization` waits for the client's `initialize` on a connection attached (in `on_connect`)
# before the client's first message.
INITIALIZE_WAIT_SECONDS = 10.0


class StopCause(StrEnum):
    """Why the work waiting on an elicitation stopped before it had an outcome."""

    AGENT = "agent"  # the agent's own code: a timeout, a task cancellation
    SESSION_CANCEL = "session_cancel"  # the client's session/cancel for the elicitation's session
    CLIENT_CANCEL_REQUEST = "client_cancel_request"  # the client's $/cancel_request for the request being served
    CLIENT_DISCONNECTED = CLIENT_DISCONNECTED

    @property
    def ends_the_work(self) -> bool:
        """The client stopped the work: it ends without resuming (`idle`). After the agent's own stop it goes on."""
        return self in (StopCause.SESSION_CANCEL, StopCause.CLIENT_CANCEL_REQUEST, StopCause.CLIENT_DISCONNECTED)


def stop_cause(link: AcpLink, scope: ElicitationScope) -> StopCause:
    """Why the work waiting on an elicitation in `scope` on `link` was cancelled (ask inside the cancelled task)."""
    if link.closed:
        return StopCause.CLIENT_DISCONNECTED
    served = serving()
    if served is not None and served.cancelled_by_peer:
        return StopCause.CLIENT_CANCEL_REQUEST
    if isinstance(scope, SessionScope) and link.session_cancelled(scope.session_id):
        return StopCause.SESSION_CANCEL
    return StopCause.AGENT


_STOP_REASONS = {
    StopCause.AGENT: "the agent's work was cancelled",
    StopCause.SESSION_CANCEL: "the client cancelled the session's work",
    StopCause.CLIENT_CANCEL_REQUEST: "the client cancelled the request being served",
    StopCause.CLIENT_DISCONNECTED: CLIENT_DISCONNECTED,
}


class AcpAuthorizer:
    def __init__(self, elicitations: Elicitations, events: EventSource, metrics: Metrics | None = None) -> None:
        self.elicitations = elicitations
        self.events = events
        self.metrics = metrics or Metrics()
        self.foreground = ForegroundTracker()
        self._links: dict[str, AcpLink] = {}  # live connections by key; a link leaves when its connection ends
        self._deliveries: dict[str, asyncio.Task[None]] = {}
        events.add_listener(self._on_event)

    def now(self) -> datetime:
        return self.elicitations.now()

    async def close(self) -> None:
        await asyncio.gather(*list(self._deliveries.values()), return_exceptions=True)

    def attach(self, conn: AgentConnection, *, on_state: StateListener | None = None) -> AcpLink:
        """The connection's link, created (and put on the wire) the first time. Raises `AcpSdkUnsupported`."""
        link = SdkConnection.installed(conn)
        if not isinstance(link, AcpLink):
            link = AcpLink(conn, on_closed=self._forget)
            if not link.closed:
                self._links[link.key] = link
        if not link.closed:
            self.foreground.listen(link, on_state)
        return link

    def tables(self) -> dict[str, int]:
        """How many entries each per-connection table holds (all zero when no connection is open)."""
        return {"links": len(self._links), "deliveries": len(self._deliveries), **self.foreground.tables()}

    def _forget(self, link: AcpLink) -> None:
        self._links.pop(link.key, None)
        self.foreground.forget(link)

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
        ask_again: bool = False,
    ) -> AuthorizationOutcome:
        display_name = self.elicitations.providers.display_name(provider)
        settled = await self.elicitations.settled(user, provider, scopes, ask_again=ask_again)
        if settled is not None:
            return settled
        attached_before = SdkConnection.installed(conn) is not None
        link = self.attach(conn)
        # Only a connection attached beforehand (in on_connect) can still see the client's initialize.
        wait = INITIALIZE_WAIT_SECONDS if attached_before else 0.0
        capabilities = await link.client_capabilities(client_capabilities, wait)
        if link.closed:
            gone = AuthorizationStatus.DISCONNECTED
            return AuthorizationOutcome(gone, provider, reason=CLIENT_DISCONNECTED, provider_display_name=display_name)
        if not url_mode_advertised(capabilities):
            await self.elicitations.store.audit.record(
                "unsupported_client", identity=user, provider=provider, now=self.now()
            )
            return AuthorizationOutcome(AuthorizationStatus.UNSUPPORTED, provider, provider_display_name=display_name)

        record = await self.elicitations.create(
            connection_key=link.key, user=user, provider=provider, scopes=scopes, scope=scope, message=message
        )
        blocking = foreground and isinstance(scope, SessionScope)
        session_id = scope.session_id if isinstance(scope, SessionScope) else ""
        if blocking:
            await self.foreground.block(link, session_id)
        resumes = True
        try:
            # Registered before elicitation/create goes out: nothing can end the elicitation before this.
            with self.events.waiter(record.id) as ended:
                answer = await self._ask(link, record, scope, ended)
                if isinstance(answer, AuthorizationOutcome):
                    return await self._delivered(answer)
                if answer.kind is AnswerKind.ACCEPT:
                    await self.elicitations.consented(record)
                    # Now the browser: wait for the terminal event, or for the connection to end; nothing polls.
                    # (Inline, not a helper coroutine: thousands may wait at once, each frame costs memory.)
                    if not ended.done():
                        link.wake_on_close(ended)
                        try:
                            await ended
                        finally:
                            link.forget_waiter(ended)
                    return await self._browser_done(link, record, ended)
                outcome = await self.elicitations.answered(record, answer)
                assert outcome is not None
                resumes = outcome.status is not AuthorizationStatus.DISCONNECTED
                return await self._delivered(outcome)
        except asyncio.CancelledError:
            cause = stop_cause(link, scope)
            resumes = not cause.ends_the_work
            # Shielded: a second cancellation (e.g. the SDK closing the connection) must not leave the row open.
            await asyncio.shield(self._cancelled(link, record, cause))
            raise
        finally:
            if blocking:
                await self.foreground.unblock(link, session_id, ended=not resumes)

    async def _ask(
        self, link: AcpLink, record: ElicitationRecord, scope: ElicitationScope, ended: Waiter
    ) -> ClientAnswer | AuthorizationOutcome:
        """Send `elicitation/create` and wait for the client's answer, or for the elicitation to end meanwhile."""
        ask = asyncio.ensure_future(
            send_url_elicitation(
                link,
                elicitation_id=record.id,
                url=self.elicitations.settings.connect_url(record.id),
                message=record.message,
                scope=scope,
            )
        )
        ask.add_done_callback(_retrieve)
        try:
            either: set[asyncio.Future[Any]] = {ask, ended}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if ask.done():
                return ask.result()
            # It ended before the client answered (its time ran out, or the browser was faster): the question is
            # no longer relevant to the client.
            await link.withdraw(record.id)
            event = ended.result()
            assert event is not None  # only the bus resolves the waiter while the create is outstanding
            return await self.elicitations.outcome_of_event(record, event)
        finally:
            ask.cancel()

    async def _cancelled(self, link: AcpLink, record: ElicitationRecord, cause: StopCause) -> None:
        """The work waiting on this elicitation stopped: withdraw our request and end the elicitation.

        The browser flow may still finish on its own (the grant is then stored), but nothing resumes the stopped
        work and no `elicitation/complete` is sent for it: the client was told to drop it.
        """
        withdrawn = await link.withdraw(record.id)
        await self.elicitations.finish(
            record,
            ElicitationStatus.CANCELLED,
            CLIENT_DISCONNECTED if cause is StopCause.CLIENT_DISCONNECTED else "cancelled",
            reason=_STOP_REASONS[cause],
            detail={"cause": cause.value, "request_cancelled": withdrawn},
            close_flows=False,
        )

    async def _browser_done(self, link: AcpLink, record: ElicitationRecord, ended: Waiter) -> AuthorizationOutcome:
        """The outcome once the waiter woke: the elicitation's terminal event, or None when the connection ended."""
        event = ended.result()
        if event is not None:
            return await self._delivered(await self.elicitations.outcome_of_event(record, event))
        # The connection ended: nobody waits for the elicitation any more. A flow the user already took to the
        # provider still stores its grant (close_flows=False); nothing is sent.
        if await self.elicitations.finish(
            record,
            ElicitationStatus.CANCELLED,
            CLIENT_DISCONNECTED,
            reason=CLIENT_DISCONNECTED,
            detail={"cause": StopCause.CLIENT_DISCONNECTED.value},
            close_flows=False,
        ):
            return self.elicitations.outcome_of(record, AuthorizationStatus.DISCONNECTED, reason=CLIENT_DISCONNECTED)
        return await self.elicitations.outcome(await self.elicitations.get(record.id) or record)

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
        link = self._links.get(event.connection_key)
        if link is None:
            if event.origin == self.elicitations.store.origin:  # another process's connection is not ours to serve
                log.info(
                    "originating connection is gone; elicitation/complete not sent",
                    extra={"elicitation_id": event.elicitation_id},
                )
            return
        # Exactly once: only the single winning transition to COMPLETED publishes this event.
        task = asyncio.get_running_loop().create_task(self._deliver(link, event))
        self._deliveries[event.elicitation_id] = task
        task.add_done_callback(lambda _t: self._deliveries.pop(event.elicitation_id, None))

    async def _deliver(self, link: AcpLink, event: ElicitationEvent) -> None:
        sent = await send_completion(link, event.elicitation_id)
        since = (self.now() - event.at).total_seconds() if sent and event.at is not None else None
        self.metrics.completion(CompletionResult.SENT if sent else CompletionResult.UNDELIVERABLE, since)
        await self.elicitations.store.audit.record(
            "completion_sent" if sent else "completion_undeliverable",
            elicitation_id=event.elicitation_id,
            now=self.now(),
        )


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's exception as seen (it is re-raised where the result is read, if it is read)."""
    if not task.cancelled():
        task.exception()
