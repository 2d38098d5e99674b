"""Where an elicitation belongs on the ACP side: a session (with an optional tool call) or a request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionScope:
    """A session-scoped elicitation: work in session `session_id`, optionally for one tool call."""

    session_id: str
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestScope:
    """A request-scoped elicitation outside any session, e.g. while serving `authenticate`."""

    request_id: str | int | None


ElicitationScope = SessionScope | RequestScope
