"""Getting a user's authorization from inside an MCP tool, and telling the client's connection when it is done.

`McpAuthorizer` drives the elicitation lifecycle through the `Lifecycle` port (`service.faces`), in process for the
embedded connector and over the `/v1` API for the sidecar client, as `AcpAuthorizer` does for ACP. What the client
sees follows the protocol version the connection negotiated:

- 2025-11-25 and earlier, `request_authorization`: a URL-mode `elicitation/create` (with an `elicitationId`) on the
  tool call's own stream; the client's `accept` is consent to open the URL, the call then waits for the browser, and
  a completed elicitation is told to that client once with `notifications/elicitation/complete` before the call
  returns. `require_authorization` is the specification's alternative: the tool call answers the `-32042` error
  (URL elicitation required) carrying the elicitation, the client opens the URL, the completion is told on the
  connection's standalone channel, and the client retries the call, which a stored grant then answers at once.
- 2026-07-28 (`service.mcp.rounds`): no server-to-client requests and no completion notification. The tool returns
  an `InputRequiredResult` whose input request is the URL-mode elicitation; the client retries the call with its
  answer and the echoed `requestState`, and the retried call waits for the browser.

A client that did not advertise URL mode (by MCP's rule: an empty `elicitation` object means form only) gets the
honest `unsupported` outcome, never a form. A stored grant answers before anything about the client is looked at.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic

import anyio
from mcp.server.mcpserver import Context
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import ElicitRequestURLParams, InputRequiredResult, RequestId
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from service.core.answers import AnswerKind, ClientAnswer
from service.core.identity import Identity
from service.core.outcomes import AuthorizationOutcome, StopCause
from service.core.scopes import RequestScope
from service.faces.completions import CompletionTeller, completed
from service.faces.lifecycle import AuthorizationAsk, E, H, Lifecycle, abandoned

from .adapter import connection_of
from .answers import read_answer, without_asking
from .link import LINK_KEY_PREFIX, McpLink
from .rounds import InputRounds

log = logging.getLogger("service.mcp")

McpContext = Context[Any, Any]  # what an `MCPServer` tool receives
# The provider and scopes to ask for, from what the tool asked (the embedded connector fills in default scopes).
Resolve = Callable[[str, Sequence[str] | None], tuple[str, Sequence[str] | None]]


class McpAuthorizer(Generic[H, E]):
    """The MCP face of a `Lifecycle`: the embedded connector's (in process) and the sidecar client's (over HTTP)."""

    def __init__(self, lifecycle: Lifecycle[H, E], resolve: Resolve | None = None) -> None:
        self.lifecycle = lifecycle
        self._resolve = resolve
        self.rounds: InputRounds[H, E] = InputRounds(lifecycle)
        self._links: dict[str, McpLink] = {}  # live connections by key; a link leaves when its connection closes
        self.completions = CompletionTeller(lifecycle, self._send_completion)
        self._watches: set[asyncio.Task[None]] = set()
        lifecycle.on_completed(self._completed)

    async def close(self) -> None:
        for watch in list(self._watches):
            watch.cancel()
        await asyncio.gather(*self._watches, return_exceptions=True)
        await self.completions.close()
        await self.rounds.close()

    def tables(self) -> dict[str, int]:
        """How many entries each per-connection table holds (all zero when nothing is open)."""
        return {"links": len(self._links), "deliveries": len(self.completions), "watches": len(self._watches)}

    def link(self, session: ServerSession) -> McpLink:
        """The link of the connection `session` belongs to (made the first time). Raises `McpSdkUnsupported`."""
        link = McpLink.of(connection_of(session), self._forget)
        if not link.closed:
            self._links[link.key] = link
        return link

    def _forget(self, link: McpLink) -> None:
        self._links.pop(link.key, None)

    # -- the tool's calls -----------------------------------------------------------------------------------------
    async def request_authorization(
        self,
        ctx: McpContext,
        *,
        user: Identity,
        provider: str,
        scopes: Sequence[str] | None = None,
        message: str | None = None,
        ask_again: bool = False,
        account: str | None = None,
    ) -> AuthorizationOutcome | InputRequiredResult:
        """Make sure `user` holds a grant at `provider` covering `scopes`, asking through the client if needed.

        `user` is the identity the server verified (e.g. `user_from_access_token`), never something the client
        sent. On a 2026-07-28 connection this may return an `InputRequiredResult`: return it from the tool as it
        is (the client answers and retries the call, and this then waits for the browser). Otherwise it returns when
        the grant exists, or with the reason it does not (`AuthorizationOutcome.status`): `unsupported` for a client
        without URL mode, `declined` / `cancelled` for the client's answer, `expired`, `failed`. If the tool call is
        cancelled meanwhile, the elicitation ends as cancelled and `CancelledError` propagates. `account` names
        which of the user's accounts at the provider is meant, as for ACP (`AgentCalls.request_authorization`):
        without it, a user holding several there raises `AccountChoiceNeeded`.
        """
        ask = self._ask(ctx, user, provider, scopes, message, ask_again, account)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return await self.rounds.round(ctx, ask)
        session = ctx.session
        answered = await without_asking(self.lifecycle, ask, session.client_capabilities)
        if answered is not None:
            return answered
        link = self.link(session)
        created = await self.lifecycle.create(ask, link.key)
        if isinstance(created, AuthorizationOutcome):
            return created  # a grant settled it meanwhile
        handle: H = created
        request_id = ctx.request_context.request_id
        assert request_id is not None  # a tool call is a request
        link.waiting(handle.id, session, request_id)
        try:
            # Registered before elicitation/create goes out: nothing can end the elicitation before this.
            with self.lifecycle.waiter(handle) as ended:
                answer = await self._elicit(session, request_id, handle, ended)
                if isinstance(answer, AuthorizationOutcome):
                    return await self.completions.delivered(answer, handle)
                outcome = await self.lifecycle.answered(handle, answer)
                if outcome is not None:
                    return outcome
                await asyncio.wait([ended])  # accepted: the browser decides now
                end = ended.result()
                if end is None:
                    return await abandoned(self.lifecycle, handle, ask.provider)
                return await self.completions.delivered(await self.lifecycle.outcome_of_end(handle, end), handle)
        except asyncio.CancelledError:
            cause = StopCause.CLIENT_DISCONNECTED if link.closed else StopCause.AGENT
            await asyncio.shield(self.lifecycle.cancel(handle, cause))
            raise
        finally:
            link.done_waiting(handle.id)

    async def require_authorization(
        self,
        ctx: McpContext,
        *,
        user: Identity,
        provider: str,
        scopes: Sequence[str] | None = None,
        message: str | None = None,
        ask_again: bool = False,
        account: str | None = None,
    ) -> AuthorizationOutcome | InputRequiredResult:
        """Like `request_authorization`, but on a 2025-11-25 connection the client is asked with the `-32042` error.

        A stored grant answers at once (call it first thing in the tool; a retried call finds the grant). Without
        one, this creates the elicitation and raises `UrlElicitationRequiredError` (let it propagate: the SDK
        answers the tool call with JSON-RPC error -32042 carrying the URL and `elicitationId`); when the browser
        finishes, the connection gets `notifications/elicitation/complete` once and the client retries. A client
        without URL mode gets `unsupported`. On 2026-07-28, where -32042 no longer exists, this is
        `request_authorization` (its input-required round trip).
        """
        ask = self._ask(ctx, user, provider, scopes, message, ask_again, account)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return await self.rounds.round(ctx, ask)
        answered = await without_asking(self.lifecycle, ask, ctx.session.client_capabilities)
        if answered is not None:
            return answered
        link = self.link(ctx.session)
        created = await self.lifecycle.create(ask, link.key)
        if isinstance(created, AuthorizationOutcome):
            return created
        self._watch(created)
        params = ElicitRequestURLParams(
            message=created.message, url=self.lifecycle.url(created), elicitation_id=created.id
        )
        raise UrlElicitationRequiredError([params])

    # -- steps ----------------------------------------------------------------------------------------------------
    def _ask(
        self,
        ctx: McpContext,
        user: Identity,
        provider: str,
        scopes: Sequence[str] | None,
        message: str | None,
        ask_again: bool,
        account: str | None = None,
    ) -> AuthorizationAsk:
        request_id = ctx.request_context.request_id
        if not isinstance(user, Identity):
            raise TypeError("user must be the verified Identity of the request's user")
        scope = RequestScope(request_id if isinstance(request_id, str | int) else str(request_id))
        if self._resolve is not None:
            provider, scopes = self._resolve(provider, scopes)
        return AuthorizationAsk(user, provider, scopes, scope, message, ask_again, account=account)

    async def _elicit(
        self, session: ServerSession, request_id: RequestId, handle: H, ended: asyncio.Future[E | None]
    ) -> ClientAnswer | AuthorizationOutcome:
        """Send the URL-mode `elicitation/create` on the tool call's stream and wait for the client's answer, or
        for the elicitation to end meanwhile (its time ran out, or the browser was faster)."""
        ask: asyncio.Future[Any] = asyncio.ensure_future(
            session.elicit_url(
                message=handle.message,
                url=self.lifecycle.url(handle),
                elicitation_id=handle.id,
                related_request_id=request_id,
            )
        )
        try:
            either: list[asyncio.Future[Any]] = [ask, ended]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if ask.done():
                return _answer_of(ask)
            end = ended.result()
            assert end is not None  # only the lifecycle resolves the waiter while the create is outstanding
            return await self.lifecycle.outcome_of_end(handle, end)
        finally:
            ask.cancel()

    def _watch(self, handle: H) -> None:
        """Follow an elicitation nobody waits on inline (the `-32042` path) and tell its completion."""

        async def watch() -> None:
            with self.lifecycle.waiter(handle) as ended:
                end = await ended
            if end is None:
                return
            outcome = await self.lifecycle.outcome_of_end(handle, end)
            if completed(outcome):
                await self.completions.tell(handle.id, handle.connection_key)

        task = asyncio.get_running_loop().create_task(watch())
        self._watches.add(task)
        task.add_done_callback(self._watched)

    def _watched(self, task: asyncio.Task[None]) -> None:
        self._watches.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("following an elicitation failed: %s", type(task.exception()).__name__)

    # -- completions ----------------------------------------------------------------------------------------------
    def _completed(self, elicitation_id: str, connection_key: str, created_here: bool) -> None:
        if connection_key in self._links or (created_here and connection_key.startswith(LINK_KEY_PREFIX)):
            self.completions.tell(elicitation_id, connection_key)
        # Otherwise another process (or the ACP face) holds the connection: that one tells it.

    async def _send_completion(self, elicitation_id: str, connection_key: str) -> bool:
        link = self._links.get(connection_key)
        return link is not None and await link.send_completion(elicitation_id)


def _answer_of(ask: asyncio.Future[Any]) -> ClientAnswer:
    """The client's answer from the finished `elicitation/create`: its result, its error, or the connection's end."""
    if ask.cancelled():
        return ClientAnswer(AnswerKind.DISCONNECTED)
    error = ask.exception()
    if error is None:
        return read_answer(ask.result())
    if isinstance(error, MCPError):
        return ClientAnswer(AnswerKind.ERROR, error_code=error.error.code)
    if isinstance(error, ValidationError):
        return ClientAnswer(AnswerKind.ERROR, message="malformed_response: the result is not an elicitation result")
    if isinstance(error, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream):
        return ClientAnswer(AnswerKind.DISCONNECTED)
    return ClientAnswer(AnswerKind.ERROR, message=f"the answer could not be read ({type(error).__name__})")
