"""`McpLink`: one MCP client connection as the face knows it, and the once-only completion sent on it.

A link lives in its `Connection`'s per-connection `state` and leaves the face's table when the SDK unwinds the
connection's `exit_stack` (the connection closed). It knows which of its tool calls are still waiting on an
elicitation, so a completion rides that call's own response stream (on streamable HTTP, the POST being answered)
while it is open, and the connection's standalone channel otherwise (the `-32042` path, whose call already
answered).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from mcp.server.connection import Connection
from mcp.server.session import ServerSession
from mcp_types import ElicitCompleteNotification, ElicitCompleteNotificationParams, RequestId

log = logging.getLogger("service.mcp")

COMPLETE_METHOD = "notifications/elicitation/complete"
_STATE_KEY = "service.mcp.link"
# Every MCP connection key starts so: a completion this process created for a key it no longer holds is an MCP
# connection's (told undeliverable here), not another face's.
LINK_KEY_PREFIX = "mcp-link-"


@dataclass(eq=False)
class McpLink:
    connection: Connection
    key: str = field(default_factory=lambda: f"{LINK_KEY_PREFIX}{uuid.uuid4().hex}")
    closed: bool = False
    _waiting: dict[str, tuple[ServerSession, RequestId]] = field(default_factory=dict)

    @classmethod
    def of(cls, connection: Connection, on_closed: Callable[[McpLink], None]) -> McpLink:
        """The connection's link, made (and set to leave `on_closed` when the connection closes) the first time."""
        link = connection.state.get(_STATE_KEY)
        if isinstance(link, McpLink):
            return link
        link = cls(connection)
        connection.state[_STATE_KEY] = link

        def closed() -> None:
            link.closed = True
            link._waiting.clear()
            on_closed(link)

        connection.exit_stack.callback(closed)
        return link

    def waiting(self, elicitation_id: str, session: ServerSession, request_id: RequestId) -> None:
        """A tool call (`request_id`, served with `session`) waits on the elicitation: tell it on that call."""
        self._waiting[elicitation_id] = (session, request_id)

    def done_waiting(self, elicitation_id: str) -> None:
        self._waiting.pop(elicitation_id, None)

    async def send_completion(self, elicitation_id: str) -> bool:
        """`notifications/elicitation/complete` for the elicitation; False when it cannot reach the client."""
        if self.closed:
            return False
        notification = ElicitCompleteNotification(
            params=ElicitCompleteNotificationParams(elicitation_id=elicitation_id)
        )
        waiting = self._waiting.get(elicitation_id)
        try:
            if waiting is not None:
                session, request_id = waiting
                await session.send_notification(notification, related_request_id=request_id)
            elif self.connection.has_standalone_channel:
                data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
                await self.connection.notify(data["method"], data.get("params"))
            else:
                return False  # e.g. stateless HTTP: no channel outside a request
        except Exception as exc:  # the transport closed under us: the completion is undeliverable
            log.info("a completion could not be sent: %s", type(exc).__name__, extra={"elicitation_id": elicitation_id})
            return False
        return True
