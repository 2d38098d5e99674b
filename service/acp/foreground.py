"""Foreground state per session: `requires_action` while foreground work waits on the user, then `running`.

Counts blocked elicitations per (connection, session), so several outstanding ones cause one update, not
one each. On ACP v2 connections the state goes out as `session/update` `state_update`; on every connection
the agent's own listener (given to `Connector.attach`) hears the same transitions.
"""

from __future__ import annotations

import inspect
import logging

from .link import AcpLink, ForegroundState, StateListener

log = logging.getLogger("service.acp")


class ForegroundTracker:
    def __init__(self) -> None:
        self._blocked: dict[tuple[str, str], int] = {}
        self._listeners: dict[str, StateListener] = {}

    def listen(self, link: AcpLink, listener: StateListener | None) -> None:
        if listener is not None:
            self._listeners[link.key] = listener

    def forget(self, link: AcpLink) -> None:
        """The connection ended: drop its listener (blocked counts go as each waiting call ends)."""
        self._listeners.pop(link.key, None)

    def tables(self) -> dict[str, int]:
        return {"blocked_sessions": len(self._blocked), "state_listeners": len(self._listeners)}

    async def block(self, link: AcpLink, session_id: str) -> None:
        """Foreground work in `session_id` cannot go on until the user acts."""
        key = (link.key, session_id)
        self._blocked[key] = self._blocked.get(key, 0) + 1
        if self._blocked[key] == 1:
            await self._report(link, session_id, ForegroundState.REQUIRES_ACTION)

    async def unblock(self, link: AcpLink, session_id: str, *, ended: bool = False) -> None:
        """The blocked work resumes (`running`) or, when `ended`, stops without resuming (`idle`)."""
        key = (link.key, session_id)
        count = self._blocked.get(key, 0)
        if count == 0:
            return
        if count > 1:
            self._blocked[key] = count - 1
            return
        del self._blocked[key]
        if ended:
            await self._report(link, session_id, ForegroundState.IDLE, stop_reason="cancelled")
        else:
            await self._report(link, session_id, ForegroundState.RUNNING)

    async def _report(
        self, link: AcpLink, session_id: str, state: ForegroundState, stop_reason: str | None = None
    ) -> None:
        await link.send_state(session_id, state, stop_reason)
        listener = self._listeners.get(link.key)
        if listener is None:
            return
        try:
            result = listener(session_id, state)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("foreground state listener failed")
