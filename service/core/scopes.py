"""Where an elicitation belongs on the ACP side: a session (with an optional tool call) or a request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionScope:
    """A session-scoped elicitation: work in session `session_id`, optionally for one tool call."""

    session_id: str
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, str) or not self.session_id:
            raise ValueError("SessionScope needs a non-empty session_id")


@dataclass(frozen=True, slots=True)
class RequestScope:
    """A request-scoped elicitation outside any session, e.g. while serving `authenticate`.

    `request_id` is the JSON-RPC id of the client's request being served: a string or an integer. A null id
    cannot be sent (the SDK drops null fields, so the client would see no scope at all), so it is refused here.
    """

    request_id: str | int

    def __post_init__(self) -> None:
        if self.request_id is None or isinstance(self.request_id, bool):
            raise ValueError(
                "RequestScope needs the JSON-RPC id (a string or an integer) of the request being served; "
                "a null id cannot be sent in elicitation/create"
            )
        if not isinstance(self.request_id, str | int):
            raise ValueError("RequestScope.request_id must be a string or an integer")


ElicitationScope = SessionScope | RequestScope
