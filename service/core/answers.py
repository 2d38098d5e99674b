"""The client's answer to `elicitation/create`, and how each answer other than accept ends the elicitation."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from enum import StrEnum

from .outcomes import CLIENT_DISCONNECTED, AuthorizationStatus, refusal_reason
from .states import ElicitationStatus


class AnswerKind(StrEnum):
    """How the client answered `elicitation/create` (or why there is no answer)."""

    ACCEPT = "accept"  # the user consented to open the URL; the flow goes on in the browser
    DECLINE = "decline"
    CANCEL = "cancel"  # with `client_message`: the client refused by its own policy; without: a person dismissed it
    UNKNOWN_ACTION = "unknown_action"  # an `action` this connector does not know (`action` names it)
    ERROR = "error"  # a JSON-RPC error, or an answer that cannot be read
    DISCONNECTED = "disconnected"  # the connection closed before an answer came


@dataclass(frozen=True, slots=True)
class ClientAnswer:
    kind: AnswerKind
    error_code: int | None = None  # the JSON-RPC error code, for ERROR
    message: str | None = None  # a short, secret-free explanation of our own, for ERROR
    client_message: str | None = None  # the client's `_meta.message` on a cancel, as received (sanitised here)
    action: str | None = None  # the unknown action, as received (sanitised here), for UNKNOWN_ACTION


CLIENT_TEXT_LIMIT = 200  # characters kept of a text the client chose (a refusal's message, an unknown action)


def client_text(value: object, limit: int = CLIENT_TEXT_LIMIT) -> str | None:
    """A text the client chose, fit for an outcome, an audit row and a log line: control and format characters
    (including bidirectional overrides) become spaces, whitespace runs collapse, at most `limit` characters are
    kept (an ellipsis marks the cut). None when there is no text."""
    if not isinstance(value, str):
        return None
    cleaned = "".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in value[: limit * 4])
    text = " ".join(cleaned.split())
    if not text:
        return None
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


@dataclass(frozen=True, slots=True)
class AnswerEnding:
    """How an answer other than accept ends an elicitation: the outcome's status, the terminal state, the stored
    reason, the audit event, and the client's own sentence (a refusal's `_meta.message`), sanitised."""

    status: AuthorizationStatus
    target: ElicitationStatus
    reason: str
    event: str
    client_message: str | None = None


def ending_of(answer: ClientAnswer) -> AnswerEnding:
    """The ending `answer` means (not for accept, which leaves the decision to the browser).

    A cancel that carries the client's own reason (`_meta.message`) is the client refusing by its policy
    (`refused`, event `refused`); a plain cancel is a person dismissing it (`cancelled`)."""
    kind = answer.kind
    if kind is AnswerKind.DECLINE:
        return _ending(AuthorizationStatus.DECLINED, ElicitationStatus.DECLINED, "declined in the client")
    if kind is AnswerKind.CANCEL:
        message = client_text(answer.client_message)
        if message is None:
            return _ending(AuthorizationStatus.CANCELLED, ElicitationStatus.CANCELLED, "dismissed in the client")
        status = AuthorizationStatus.REFUSED
        return AnswerEnding(status, ElicitationStatus.CANCELLED, refusal_reason(message), status.value, message)
    if kind is AnswerKind.DISCONNECTED:
        return AnswerEnding(
            AuthorizationStatus.DISCONNECTED, ElicitationStatus.CANCELLED, CLIENT_DISCONNECTED, CLIENT_DISCONNECTED
        )
    if kind is AnswerKind.UNKNOWN_ACTION:
        reason = f"unknown_action: {client_text(answer.action, 64) or '(empty)'}"
        return _ending(AuthorizationStatus.CLIENT_ERROR, ElicitationStatus.FAILED, reason)
    if answer.error_code is not None:
        reason = f"client answered with JSON-RPC error {answer.error_code}"
    else:
        reason = answer.message or "the client's answer could not be read"
    return _ending(AuthorizationStatus.CLIENT_ERROR, ElicitationStatus.FAILED, reason)


def _ending(status: AuthorizationStatus, target: ElicitationStatus, reason: str) -> AnswerEnding:
    return AnswerEnding(status, target, reason, status.value)
