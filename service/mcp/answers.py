"""The client's answer to a URL-mode `elicitation/create`, as the lifecycle records it."""

from __future__ import annotations

from typing import Any

from mcp_types import ElicitResult

from service.core.answers import AnswerKind, ClientAnswer


def read_answer(result: Any) -> ClientAnswer:
    """`accept` (consent to open the URL), `decline`, `cancel`; anything else is the client's error."""
    if not isinstance(result, ElicitResult):
        return ClientAnswer(AnswerKind.ERROR, message="malformed_response: not an elicitation result")
    if result.action == "accept":
        return ClientAnswer(AnswerKind.ACCEPT)
    if result.action == "decline":
        return ClientAnswer(AnswerKind.DECLINE)
    return ClientAnswer(AnswerKind.CANCEL)
