"""Getting a user's authorization over one ACP connection, and telling that connection when it is done.

`AcpAuthorizer` owns the agent's view of its client connections (`AcpLink`s, dropped when a connection ends),
foreground state per session, and the delivery of `elicitation/complete` to the connection that asked. It drives
the elicitation lifecycle through the `Lifecycle` port (`service.faces.lifecycle`): in process for the embedded
connector, over the `/v1` API for the sidecar client; the ACP side, and so what the client sees, is the same.
`request_authorization` runs one elicitation: settle it from stored grants or create it, send `elicitation/create`,
record the answer, wait for the browser, and end it honestly when anything stops it early. What goes on the wire
then:

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
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Generic

from service.core.answers import ClientAnswer
from service.core.identity import Identity
from service.core.outcomes import CLIENT_DISCONNECTED, AuthorizationOutcome, AuthorizationStatus, StopCause
from service.core.scopes import ElicitationScope, SessionScope
from service.faces.completions import CompletionTeller
from service.faces.lifecycle import AuthorizationAsk, E, H, Lifecycle, abandoned

from .adapter import AgentConnection, SdkConnection
from .capabilities import url_mode_advertised
from .foreground import ForegroundTracker
from .link import LINK_KEY_PREFIX, AcpLink, StateListener
from .messages import send_completion, send_url_elicitation
from .wire import serving

# How long `request_authorization` waits for the client's `initialize` on a connection attached (in `on_connect`)
# before the client's first message.
INITIALIZE_WAIT_SECONDS = 10.0


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


class AcpAuthorizer(Generic[H, E]):
    """The ACP face of a `Lifecycle`: the embedded connector's (in process) and the sidecar client's (over HTTP)."""

    def __init__(self, lifecycle: Lifecycle[H, E]) -> None:
        self.lifecycle = lifecycle
        self.foreground = ForegroundTracker()
        self._links: dict[str, AcpLink] = {}  # live connections by key; a link leaves when its connection ends
        self.completions = CompletionTeller(lifecycle, self._send_completion)
        lifecycle.on_completed(self._completed)

    async def close(self) -> None:
        await self.completions.close()

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
        return {"links": len(self._links), "deliveries": len(self.completions), **self.foreground.tables()}

    def _forget(self, link: AcpLink) -> None:
        self._links.pop(link.key, None)
        self.foreground.forget(link)

    def request_authorization(
        self,
        conn: AgentConnection,
        client_capabilities: Any,
        *,
        user: Identity,
        provider: str,
        scopes: Sequence[str] | None,
        scope: ElicitationScope,
        message: str | None,
        foreground: bool,
        ask_again: bool = False,
        connection: Mapping[str, str] | None = None,
        account: str | None = None,
        resolve: Callable[[str, Sequence[str] | None], tuple[str, Sequence[str] | None]] | None = None,
    ) -> Coroutine[Any, Any, AuthorizationOutcome]:
        """Settle the request from stored grants, else ask the client (URL mode only) and wait for the browser.

        `resolve(provider, scopes)` gives what to ask for (the face's catalog name and default scopes); it runs in
        the coroutine, so its errors come from the await."""
        ask = AuthorizationAsk(user, provider, scopes, scope, message, ask_again, connection, account)
        blocked = scope.session_id if foreground and isinstance(scope, SessionScope) else None
        return self._authorize(partial(self._begin, conn, client_capabilities, ask, resolve), scope, blocked)

    async def _authorize(
        self,
        begin: Callable[[], Awaitable[AuthorizationOutcome | tuple[AcpLink, H, str]]],
        scope: ElicitationScope,
        blocked: str | None,
    ) -> AuthorizationOutcome:
        """`begin()`, then ask the client and wait; `blocked`: the session whose foreground work waits on it."""
        # This frame lives as long as the user takes, and thousands may wait at once: it holds only what the wait
        # needs (what comes before the elicitation exists runs in `_begin`, whose frame is gone by then), and the
        # question and the answer are not kept while the user takes their time.
        begun = await begin()
        del begin
        if isinstance(begun, AuthorizationOutcome):
            return begun
        link, handle, provider = begun
        del begun
        if blocked is not None:
            await self.foreground.block(link, blocked)
        resumes = True
        # Registered before elicitation/create goes out: nothing can end the elicitation before this. (Entered by
        # hand: a `with` would keep its bound __exit__ for as long as the call waits.)
        waiting = self.lifecycle.waiter(handle)
        ended = waiting.__enter__()
        try:
            try:
                answer = await self._ask(link, handle, scope, ended)
                if isinstance(answer, AuthorizationOutcome):
                    return await self._delivered(answer, handle)
                outcome = await self.lifecycle.answered(handle, answer)
                del answer
                if outcome is None:
                    # Accepted. Now the browser: wait for the end, or for the connection to end; nothing polls here.
                    handle = self.lifecycle.kept(handle)
                    if not ended.done():
                        link.wake_on_close(ended)
                        try:
                            await ended
                        finally:
                            link.forget_waiter(ended)
                    return await self._browser_done(handle, ended, provider)
                resumes = outcome.status is not AuthorizationStatus.DISCONNECTED
                return await self._delivered(outcome, handle)
            finally:
                waiting.__exit__(None, None, None)
        except asyncio.CancelledError:
            cause = stop_cause(link, scope)
            resumes = not cause.ends_the_work
            # Shielded: a second cancellation (e.g. the SDK closing the connection) must not leave the row open.
            await asyncio.shield(self._cancelled(link, handle, cause))
            raise
        finally:
            if blocked is not None:
                await self.foreground.unblock(link, blocked, ended=not resumes)

    async def _begin(
        self,
        conn: AgentConnection,
        client_capabilities: Any,
        ask: AuthorizationAsk,
        resolve: Callable[[str, Sequence[str] | None], tuple[str, Sequence[str] | None]] | None,
    ) -> AuthorizationOutcome | tuple[AcpLink, H, str]:
        """The outcome when no elicitation is needed or none can be made; else the link, the new elicitation and
        the provider asked for."""
        if resolve is not None:
            provider, scopes = resolve(ask.provider, ask.scopes)
            ask = replace(ask, provider=provider, scopes=scopes)
        settled = await self.lifecycle.settled(ask)
        if settled is not None:
            return settled
        attached_before = SdkConnection.installed(conn) is not None
        link = self.attach(conn)
        # Only a connection attached beforehand (in on_connect) can still see the client's initialize.
        wait = INITIALIZE_WAIT_SECONDS if attached_before else 0.0
        capabilities = await link.client_capabilities(client_capabilities, wait)
        if link.closed:
            return AuthorizationOutcome(
                AuthorizationStatus.DISCONNECTED,
                ask.provider,
                reason=CLIENT_DISCONNECTED,
                provider_display_name=self.lifecycle.display_name(ask.provider),
            )
        if not url_mode_advertised(capabilities):
            await self.lifecycle.unsupported(ask)
            return AuthorizationOutcome(
                AuthorizationStatus.UNSUPPORTED,
                ask.provider,
                provider_display_name=self.lifecycle.display_name(ask.provider),
            )
        created = await self.lifecycle.create(ask, link.key)
        if isinstance(created, AuthorizationOutcome):
            return created  # a grant settled it meanwhile
        return link, created, ask.provider

    async def _ask(
        self, link: AcpLink, handle: H, scope: ElicitationScope, ended: asyncio.Future[E | None]
    ) -> ClientAnswer | AuthorizationOutcome:
        """Send `elicitation/create` and wait for the client's answer, or for the elicitation to end meanwhile."""
        ask = asyncio.ensure_future(
            send_url_elicitation(
                link, elicitation_id=handle.id, url=self.lifecycle.url(handle), message=handle.message, scope=scope
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
            await link.withdraw(handle.id)
            end = ended.result()
            assert end is not None  # only the lifecycle resolves the waiter while the create is outstanding
            return await self.lifecycle.outcome_of_end(handle, end)
        finally:
            ask.cancel()

    async def _cancelled(self, link: AcpLink, handle: H, cause: StopCause) -> None:
        """The work waiting on this elicitation stopped: withdraw our request and end the elicitation.

        The browser flow may still finish on its own (the grant is then stored), but nothing resumes the stopped
        work and no `elicitation/complete` is sent for it: the client was told to drop it.
        """
        withdrawn = await link.withdraw(handle.id)
        await self.lifecycle.cancel(handle, cause, request_cancelled=withdrawn)

    async def _browser_done(self, handle: H, ended: asyncio.Future[E | None], provider: str) -> AuthorizationOutcome:
        """The outcome once the waiter woke: the elicitation's end, or None when the connection ended."""
        end = ended.result()
        if end is not None:
            return await self._delivered(await self.lifecycle.outcome_of_end(handle, end), handle)
        # The connection ended: nobody waits for the elicitation any more.
        return await abandoned(self.lifecycle, handle, provider)

    async def _delivered(self, outcome: AuthorizationOutcome, handle: H) -> AuthorizationOutcome:
        """Let `elicitation/complete` reach the client before the waiting work resumes (once, whoever tells it)."""
        return await self.completions.delivered(outcome, handle)

    def _completed(self, elicitation_id: str, connection_key: str, created_here: bool) -> None:
        if connection_key in self._links or (created_here and connection_key.startswith(LINK_KEY_PREFIX)):
            self.completions.tell(elicitation_id, connection_key)
        # Otherwise another replica (or the MCP face) holds the connection: that one tells it.

    async def _send_completion(self, elicitation_id: str, connection_key: str) -> bool:
        link = self._links.get(connection_key)
        return link is not None and await send_completion(link, elicitation_id)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's exception as seen (it is re-raised where the result is read, if it is read)."""
    if not task.cancelled():
        task.exception()
