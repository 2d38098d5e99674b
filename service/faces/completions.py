"""Telling a client that its elicitation completed: one task per elicitation in this process, whoever asks.

A face asks from three places (the waiting call before it returns, the event bus when an elicitation completes, a
follower of an elicitation nobody waits on); the first ask starts the one task, the others join it, and the
lifecycle's `tell_completion` makes the telling once across processes too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from service.core.outcomes import AuthorizationOutcome, AuthorizationStatus

from .lifecycle import Handle, Lifecycle

# Send the completion of (elicitation id) on the connection (key): True when it reached the client.
Send = Callable[[str, str], Awaitable[bool]]


def completed(outcome: AuthorizationOutcome) -> bool:
    """Whether the client is told the elicitation completed (a grant was stored, all scopes or fewer)."""
    return outcome.status in (AuthorizationStatus.AUTHORIZED, AuthorizationStatus.NARROWED)


class CompletionTeller:
    def __init__(self, lifecycle: Lifecycle[Any, Any], send: Send) -> None:
        self.lifecycle = lifecycle
        self._send = send
        self._deliveries: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._deliveries)

    async def close(self) -> None:
        await asyncio.gather(*list(self._deliveries.values()), return_exceptions=True)

    def tell(self, elicitation_id: str, connection_key: str) -> asyncio.Task[None]:
        """Tell the connection that the elicitation completed (the task already under way, if any)."""
        task = self._deliveries.get(elicitation_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._deliver(elicitation_id, connection_key))
            self._deliveries[elicitation_id] = task
            task.add_done_callback(lambda _t: self._deliveries.pop(elicitation_id, None))
        return task

    async def _deliver(self, elicitation_id: str, connection_key: str) -> None:
        await self.lifecycle.tell_completion(elicitation_id, lambda: self._send(elicitation_id, connection_key))

    async def delivered(self, outcome: AuthorizationOutcome, handle: Handle) -> AuthorizationOutcome:
        """Let the completion reach the client before the waiting work resumes (the waiting call tells it itself
        when nothing else has started telling it)."""
        if completed(outcome) and outcome.elicitation_id is not None:
            await asyncio.shield(self.tell(outcome.elicitation_id, handle.connection_key))
        return outcome
