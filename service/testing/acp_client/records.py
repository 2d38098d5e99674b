"""What the scripted client records: each `elicitation/create` it received (`Elicitation`) and what became of it,
the wire transcript, the rules the agent broke, the messages it ignored, and ACP v2 state updates."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from service.util.hosts import HostAssessment

from .answers import Answer, AnswerSpec, Reply

__all__ = ["ConsentRequired", "Elicitation", "IgnoredMessage", "StateUpdate", "Violation", "WireMessage"]


class ConsentRequired(AssertionError):
    """A test asked for an elicitation's URL although the client has not consented to open it."""


@dataclass(frozen=True, slots=True)
class WireMessage:
    direction: str  # "in": agent -> client; "out": client -> agent
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Violation:
    """A rule the agent broke, as far as the client can see."""

    rule: str
    detail: str
    request_id: Any = None


@dataclass(frozen=True, slots=True)
class IgnoredMessage:
    """An `elicitation/complete` or `$/cancel_request` the client ignored, and why."""

    method: str
    key: Any  # the elicitationId or the requestId
    reason: str  # "unknown", "already_completed", "already_answered"


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """An ACP v2 `session/update` with `sessionUpdate: "state_update"` (the SDK has no model for it)."""

    session_id: str
    state: str | None
    update: dict[str, Any]


@dataclass(eq=False)
class Elicitation:
    """One `elicitation/create` the client received, and what became of it."""

    request_id: Any  # the JSON-RPC id of the agent's request
    raw_params: dict[str, Any] = field(repr=False)
    advertised: bool
    flags: list[str] = field(default_factory=list)
    host: HostAssessment | None = None
    answer: Answer | None = None  # the decision, once made
    response: dict[str, Any] | None = None  # the JSON-RPC response the client sent, once sent
    cancel_requested: bool = False  # the agent sent `$/cancel_request` for it
    completed: bool = False  # a valid `elicitation/complete` arrived for it
    claimed: bool = False
    _consented: bool = field(default=False, repr=False)
    _release: asyncio.Future[Answer] | None = field(default=None, repr=False)
    _cancel: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    answered: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def mode(self) -> str | None:
        value = self.raw_params.get("mode")
        return value if isinstance(value, str) else None

    @property
    def message(self) -> str | None:
        value = self.raw_params.get("message")
        return value if isinstance(value, str) else None

    @property
    def elicitation_id(self) -> str | None:
        value = self.raw_params.get("elicitationId")
        return value if isinstance(value, str) else None

    @property
    def session_id(self) -> str | None:
        value = self.raw_params.get("sessionId")
        return value if isinstance(value, str) else None

    @property
    def tool_call_id(self) -> str | None:
        value = self.raw_params.get("toolCallId")
        return value if isinstance(value, str) else None

    @property
    def scope_request_id(self) -> Any:
        """`requestId` of a request-scoped elicitation (not the JSON-RPC id of this request)."""
        return self.raw_params.get("requestId")

    @property
    def consented(self) -> bool:
        return self._consented

    @property
    def url(self) -> str:
        """The URL to open, available only after the client decided to accept (consent comes first)."""
        if not self._consented:
            raise ConsentRequired(f"no consent to open the URL of elicitation {self.elicitation_id!r}")
        value = self.raw_params.get("url")
        return value if isinstance(value, str) else ""

    @property
    def outstanding(self) -> bool:
        """Still pending, or accepted and not completed yet."""
        if self.completed or self.cancel_requested:
            return False
        return self.answer is None or self.answer.reply in (Reply.ACCEPT, Reply.HOLD)

    @property
    def error_code(self) -> int | None:
        """The JSON-RPC error code the client answered with, if it answered with an error."""
        error = (self.response or {}).get("error")
        return error.get("code") if isinstance(error, dict) else None

    def release(self, answer: AnswerSpec) -> None:
        """Answer an elicitation that was scripted to `hold`."""
        decided = Answer.of(answer)
        if decided.reply is Reply.HOLD:
            raise ValueError("release with a final answer, not hold")
        if self._release is None:
            self._release = asyncio.get_running_loop().create_future()
        if not self._release.done():
            self._release.set_result(decided)
