"""How the scripted user answers an `elicitation/create`: `Reply` and `Answer` (accept, decline, cancel, a JSON-RPC
error, hold until released, or a raw message in place of the response)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Answer", "AnswerSpec", "Reply"]


class Reply(StrEnum):
    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"
    ERROR = "error"  # answer with a JSON-RPC error
    HOLD = "hold"  # leave the request pending until `Elicitation.release()` or the agent's `$/cancel_request`
    RAW = "raw"  # send `Answer.raw_message(request_id)` instead of a response (a misbehaving client)


@dataclass(frozen=True, slots=True)
class Answer:
    """How the scripted user answers one elicitation."""

    reply: Reply
    error_code: int = -32603
    error_message: str = "Internal error"
    content: dict[str, Any] | None = None
    message: str | None = None  # for CANCEL: the client's own reason, sent as `_meta.message`
    raw_message: Callable[[Any], dict[str, Any]] | None = None  # for RAW: request id -> the message to send

    @classmethod
    def accept(cls, content: dict[str, Any] | None = None) -> Answer:
        return cls(Reply.ACCEPT, content=content)

    @classmethod
    def decline(cls) -> Answer:
        return cls(Reply.DECLINE)

    @classmethod
    def cancel(cls, message: str | None = None) -> Answer:
        """A cancel: a person dismissing it, or with `message` the client refusing by its own policy."""
        return cls(Reply.CANCEL, message=message)

    @classmethod
    def raw(cls, build: Callable[[Any], dict[str, Any]]) -> Answer:
        """Send `build(request_id)` (any JSON value, as a whole message) in place of the response."""
        return cls(Reply.RAW, raw_message=build)

    @classmethod
    def error(cls, code: int = -32603, message: str = "Internal error") -> Answer:
        return cls(Reply.ERROR, error_code=code, error_message=message)

    @classmethod
    def hold(cls) -> Answer:
        return cls(Reply.HOLD)

    @classmethod
    def of(cls, spec: AnswerSpec) -> Answer:
        """An `Answer`, a reply name ("accept", "decline", "cancel", "hold"), or an int: a JSON-RPC error code."""
        if isinstance(spec, Answer):
            return spec
        if isinstance(spec, bool):
            raise TypeError("an answer is an Answer, a reply name or a JSON-RPC error code")
        if isinstance(spec, int):
            return cls.error(spec, "Scripted error")
        return cls(Reply(spec))


AnswerSpec = Answer | Reply | str | int
