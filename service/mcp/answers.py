"""Answers: the one a tool gets without asking the client (a stored grant, a client without URL mode), and the
client's answer to a URL-mode elicitation as the lifecycle records it."""

from __future__ import annotations

from typing import Any

from mcp_types import ClientCapabilities, ElicitResult

from service.core.answers import AnswerKind, ClientAnswer
from service.core.outcomes import AuthorizationOutcome, AuthorizationStatus
from service.faces.lifecycle import AuthorizationAsk, Lifecycle

from .capabilities import url_mode_advertised


async def without_asking(
    lifecycle: Lifecycle[Any, Any], ask: AuthorizationAsk, capabilities: ClientCapabilities | None
) -> AuthorizationOutcome | None:
    """A stored grant's answer (looked at before anything about the client), else `unsupported` for a client that
    did not advertise URL mode (recorded; nothing is sent, never a form), else None: the client must be asked."""
    settled = await lifecycle.settled(ask)
    if settled is not None:
        return settled
    if url_mode_advertised(capabilities):
        return None
    await lifecycle.unsupported(ask)
    display_name = lifecycle.display_name(ask.provider)
    return AuthorizationOutcome(AuthorizationStatus.UNSUPPORTED, ask.provider, provider_display_name=display_name)


def read_answer(result: Any) -> ClientAnswer:
    """`accept` (consent to open the URL), `decline`, `cancel`; anything else is the client's error."""
    if not isinstance(result, ElicitResult):
        return ClientAnswer(AnswerKind.ERROR, message="malformed_response: not an elicitation result")
    if result.action == "accept":
        return ClientAnswer(AnswerKind.ACCEPT)
    if result.action == "decline":
        return ClientAnswer(AnswerKind.DECLINE)
    return ClientAnswer(AnswerKind.CANCEL)
