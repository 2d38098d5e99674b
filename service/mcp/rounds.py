"""The 2026-07-28 input-required round trip: URL-mode elicitation without server-to-client requests.

At 2026-07-28 a server cannot send `elicitation/create` while it serves a call and there is no completion
notification. The first call returns an `InputRequiredResult` whose one input request (key `authorization`) is the
URL-mode elicitation (no `elicitationId`: the revision removed it) and whose `requestState` is a random token; the
client asks its user, then retries the call with the answer and the token echoed. On the retry an `accept` is consent
to open the URL and the call waits for the browser; `decline` / `cancel` end the elicitation at once.

The token names an elicitation this process created for the same user and provider; anything else starts over.
(`MCPServer` also seals `requestState` and binds it to the bearer's principal.) The elicitation is followed from its
creation, so a browser that finishes before the client retries is not missed. A round's state is kept in this
process until the round ends or `ROUND_STATE_SECONDS` pass: behind a load balancer, retries of a call must reach the
process that answered its first round.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from mcp_types import ElicitRequest, ElicitRequestURLParams, InputRequiredResult

from service.core.outcomes import AuthorizationOutcome, StopCause
from service.faces.completions import completed
from service.faces.lifecycle import AuthorizationAsk, E, H, Lifecycle, abandoned

from .answers import read_answer, without_asking

if TYPE_CHECKING:
    from .authorizer import McpContext

ROUND_KEY = "authorization"  # the input request's key in `inputRequests` / `inputResponses`
ROUND_STATE_SECONDS = 24 * 3600.0  # how long an unanswered round's state is kept here at most
ROUND_KEY_PREFIX = "mcp-round-"  # the connection key of a round's elicitation (no face tells it on a connection)


@dataclass
class _Round(Generic[H, E]):
    handle: H
    ask: AuthorizationAsk
    ended: asyncio.Task[E | None]  # follows the elicitation from its creation
    started: float


class InputRounds(Generic[H, E]):
    """The open input-required rounds of one face, by their `requestState` token."""

    def __init__(self, lifecycle: Lifecycle[H, E]) -> None:
        self.lifecycle = lifecycle
        self._rounds: dict[str, _Round[H, E]] = {}

    def __len__(self) -> int:
        return len(self._rounds)

    async def close(self) -> None:
        for token in list(self._rounds):
            self._drop(token)

    async def round(self, ctx: McpContext, ask: AuthorizationAsk) -> AuthorizationOutcome | InputRequiredResult:
        """One call of the round trip: the question (first call), or the answer's outcome (the retry)."""
        token = ctx.request_state or ""
        open_round = self._rounds.get(token)
        if open_round is None or (open_round.ask.user, open_round.ask.provider) != (ask.user, ask.provider):
            return await self._first(ctx, ask)
        response = (ctx.input_responses or {}).get(ROUND_KEY)
        if response is None:
            return self._question(token, open_round)  # retried without an answer: ask again
        outcome = await self.lifecycle.answered(open_round.handle, read_answer(response))
        if outcome is not None:
            self._drop(token)
            return outcome
        try:
            end = await asyncio.shield(open_round.ended)  # accepted: the browser decides now
        except asyncio.CancelledError:
            await asyncio.shield(self.lifecycle.cancel(open_round.handle, StopCause.AGENT))
            self._drop(token)
            raise
        self._drop(token)
        if end is None:
            return await abandoned(self.lifecycle, open_round.handle, ask.provider)
        outcome = await self.lifecycle.outcome_of_end(open_round.handle, end)
        if completed(outcome):  # the result tells it: there is no completion notification at 2026-07-28
            await self.lifecycle.tell_completion(open_round.handle.id, _told_in_the_result)
        return outcome

    async def _first(self, ctx: McpContext, ask: AuthorizationAsk) -> AuthorizationOutcome | InputRequiredResult:
        answered = await without_asking(self.lifecycle, ask, ctx.session.client_capabilities)
        if answered is not None:
            return answered
        self._expire()
        token = secrets.token_urlsafe(32)
        # No connection outlives a 2026-07-28 call, so nothing is told on one: the key only names the round.
        created = await self.lifecycle.create(ask, f"{ROUND_KEY_PREFIX}{token[:16]}")
        if isinstance(created, AuthorizationOutcome):
            return created
        handle: H = created
        ended = asyncio.get_running_loop().create_task(self._follow(handle))
        ended.add_done_callback(_retrieve)
        open_round = _Round(handle, ask, ended, time.monotonic())
        self._rounds[token] = open_round
        return self._question(token, open_round)

    async def _follow(self, handle: H) -> E | None:
        with self.lifecycle.waiter(handle) as ended:
            return await ended

    def _question(self, token: str, open_round: _Round[H, E]) -> InputRequiredResult:
        handle = open_round.handle
        params = ElicitRequestURLParams(message=handle.message, url=self.lifecycle.url(handle))
        return InputRequiredResult(input_requests={ROUND_KEY: ElicitRequest(params=params)}, request_state=token)

    def _drop(self, token: str) -> None:
        dropped = self._rounds.pop(token, None)
        if dropped is not None:
            dropped.ended.cancel()

    def _expire(self) -> None:
        """Forget rounds nobody came back to (the elicitations themselves expire on their own)."""
        oldest = time.monotonic() - ROUND_STATE_SECONDS
        for token, open_round in list(self._rounds.items()):
            if open_round.started < oldest:
                self._drop(token)


async def _told_in_the_result() -> bool:
    return True


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's exception as seen (it is re-raised where the result is read)."""
    if not task.cancelled():
        task.exception()
