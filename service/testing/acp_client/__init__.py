"""A scripted ACP client for testing agents that use URL-mode elicitation (this connector's or anyone's).

`ScriptedClient` implements the SDK's `Client` interface. It advertises exactly the capabilities it is given (raw
JSON, so `{}` and `{"url": null}` reach the agent as written), records every JSON-RPC message on the wire, answers
each `elicitation/create` as scripted (accept, decline, cancel, a JSON-RPC error, or hold until released), and checks
the rules a client can see:

- it answers -32602 by itself when the agent requests a mode the client did not advertise (and records a violation);
- it never fetches a URL, and hands it to the test (`Elicitation.url`, `next_consented_url()`) only once it has
  decided to accept: a test that opens the link before consent fails;
- it flags Punycode/IDN and mixed-script hosts (`service.hosts.assess_host`), non-https non-loopback URLs and URLs
  carrying credentials, and duplicate `elicitationId`s among outstanding URL elicitations;
- it answers `$/cancel_request` for a pending `elicitation/create` with error -32800 (Request cancelled) and ignores
  (records) one for a request it has already answered;
- it ignores `elicitation/complete` for unknown or already-completed ids and records them in `ignored_completions`.

It can also misbehave on purpose, to test an agent's robustness: `Answer.cancel("reason")` refuses by the client's
own policy (a cancel with `_meta.message`), and `Answer.raw(build)` sends any message in place of the response.

Wire it up with `connect()` (any message transport with `send`/`receive`/`close`, e.g. one end of
`memory_transport_pair()`) or `spawn_agent()` (an agent subprocess over stdio). Both use the SDK's
`ClientSideConnection` with the unstable protocol enabled. This module imports `acp`: it is a test client, not part
of the connector (whose ACP code is `service/acp/`).
"""

from __future__ import annotations

from .answers import Answer, AnswerSpec, Reply
from .client import Script, ScriptedClient
from .records import ConsentRequired, Elicitation, IgnoredMessage, StateUpdate, Violation, WireMessage
from .spawn import STDIO_LIMIT, SpawnedAgent, spawn_agent
from .transports import Transport, memory_transport_pair
from .wire import (
    CANCEL_REQUEST,
    FORM_AND_URL,
    FORM_ONLY,
    INVALID_PARAMS,
    NO_ELICITATION,
    OMITTED,
    REQUEST_CANCELLED,
    URL_ONLY,
)

__all__ = [
    "CANCEL_REQUEST",
    "FORM_AND_URL",
    "FORM_ONLY",
    "INVALID_PARAMS",
    "NO_ELICITATION",
    "OMITTED",
    "REQUEST_CANCELLED",
    "STDIO_LIMIT",
    "URL_ONLY",
    "Answer",
    "AnswerSpec",
    "ConsentRequired",
    "Elicitation",
    "IgnoredMessage",
    "Reply",
    "Script",
    "ScriptedClient",
    "SpawnedAgent",
    "StateUpdate",
    "Transport",
    "Violation",
    "WireMessage",
    "memory_transport_pair",
    "spawn_agent",
]
