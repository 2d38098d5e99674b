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
from service.core.states import CompletionDelivery, ElicitationStatus
from service.metrics import CompletionResult, Metrics

from .adapter import AgentConnection, SdkConnection
from .capabilities import url_mode_advertised
from .foreground import ForegroundTracker
from .link import AcpLink, StateListener
from .messages import send_completion, send_url_elicitation
from .wire import serving

log = logging.getLogger("service.acp")

CONNECTION_CLOSED = "connection_closed"  # why a completion is undeliverable: the connection is gone

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
        # This process among the replicas sharing the database: the one that tells the completions of the
        # connections it holds.
        self.replica_id = elicitations.store.origin
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
            connection_key=link.key,
            user=user,
            provider=provider,
            scopes=scopes,
            scope=scope,
            message=message,
            replica_id=self.replica_id,
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
                    return await self._delivered(answer, record)
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
                return await self._delivered(outcome, record)
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
            return await self._delivered(await self.elicitations.outcome_of_event(record, event), record)
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

    async def _delivered(self, outcome: AuthorizationOutcome, record: ElicitationRecord) -> AuthorizationOutcome:
        """Let `elicitation/complete` reach the client before the waiting work resumes.

        The waiting call tells the client itself when no event has started it yet; the database makes sure that
        happens once, whoever gets there first.
        """
        completed = outcome.status in (AuthorizationStatus.AUTHORIZED, AuthorizationStatus.NARROWED)
        if completed and outcome.elicitation_id is not None:
            await asyncio.shield(self._tell(outcome.elicitation_id, record.connection_key))
        return outcome

    def _on_event(self, event: Event) -> None:
        if not isinstance(event, ElicitationEvent) or event.status is not ElicitationStatus.COMPLETED:
            return
        if event.connection_key in self._links or event.replica_id == self.replica_id:
            self._tell(event.elicitation_id, event.connection_key)
        # Otherwise another replica holds the connection: that one tells it.

    def _tell(self, elicitation_id: str, connection_key: str) -> asyncio.Task[None]:
        """Tell the connection that the elicitation completed: one task per elicitation in this process."""
        task = self._deliveries.get(elicitation_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._deliver(elicitation_id, connection_key))
            self._deliveries[elicitation_id] = task
            task.add_done_callback(lambda _t: self._deliveries.pop(elicitation_id, None))
        return task

    async def _deliver(self, elicitation_id: str, connection_key: str) -> None:
        """Send `elicitation/complete` once. The database decides, by a conditional update, whatever repeats the
        event (a duplicate, a catch-up after a reconnect, the waiting call); without a live connection the
        completion is recorded undeliverable instead."""
        store = self.elicitations.store
        try:
            completed_at = await store.elicitations.claim_completion(elicitation_id, self.replica_id)
            if completed_at is None:
                return  # told already, or settled by another replica
            link = self._links.get(connection_key)
            sent = link is not None and await send_completion(link, elicitation_id)
            async with store.transaction() as tx:
                outcome = CompletionDelivery.SENT if sent else CompletionDelivery.UNDELIVERABLE
                settled = await store.elicitations.settle_completion(elicitation_id, outcome, conn=tx)
                if settled:
                    await store.audit.record(
                        "completion_sent" if sent else "completion_undeliverable",
                        elicitation_id=elicitation_id,
                        detail={} if sent else {"reason": CONNECTION_CLOSED},
                        now=self.now(),
                        conn=tx,
                    )
        except Exception as exc:  # this replica's heartbeat catch-up tries an untold completion again
            log.warning("telling a completion failed: %s", type(exc).__name__, extra={"elicitation_id": elicitation_id})
            return
        if not settled:
            log.warning(
                "a completion was settled undeliverable while this replica was telling it (presumed gone)",
                extra={"elicitation_id": elicitation_id},
            )
        since = (self.now() - completed_at).total_seconds() if sent else None
        self.metrics.completion(CompletionResult.SENT if sent else CompletionResult.UNDELIVERABLE, since)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's exception as seen (it is re-raised where the result is read, if it is read)."""
    if not task.cancelled():
        task.exception()
