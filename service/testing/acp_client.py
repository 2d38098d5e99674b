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

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

from acp import PROTOCOL_VERSION
from acp.client.connection import ClientSideConnection
from acp.exceptions import RequestError
from acp.schema import (
    AcceptElicitationResponse,
    CancelElicitationResponse,
    CreateElicitationResponse,
    CreateTerminalResponse,
    DeclineElicitationResponse,
    DeniedOutcome,
    ElicitationFormRequestMode,
    ElicitationFormSessionMode,
    ElicitationMode,
    Implementation,
    InitializeResponse,
    KillTerminalResponse,
    PermissionOption,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalOutputResponse,
    ToolCallUpdate,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)
from acp.transports import spawn_stdio_transport

from service.core.urls import is_loopback_host
from service.util.hosts import HostAssessment, assess_host

REQUEST_CANCELLED: Final = -32800
INVALID_PARAMS: Final = -32602
CANCEL_REQUEST: Final = "$/cancel_request"
STDIO_LIMIT: Final = 50 * 1024 * 1024


class _Omitted:
    def __repr__(self) -> str:
        return "OMITTED"


OMITTED: Final = _Omitted()
"""Pass as `capabilities` to leave the capabilities field out of `initialize` entirely."""

# Ready-made capability objects, exactly as they go on the wire.
URL_ONLY: Final[Mapping[str, Any]] = {"elicitation": {"url": {}}}
FORM_ONLY: Final[Mapping[str, Any]] = {"elicitation": {"form": {}}}
FORM_AND_URL: Final[Mapping[str, Any]] = {"elicitation": {"form": {}, "url": {}}}
NO_ELICITATION: Final[Mapping[str, Any]] = {}


class Transport(Protocol):
    """A JSON-RPC message transport, as the SDK's connections take it: `receive()` returns None at the end."""

    async def send(self, message: dict[str, Any]) -> None: ...

    async def receive(self) -> dict[str, Any] | None: ...

    async def close(self) -> None: ...


class _MemoryEnd:
    def __init__(self, outbox: asyncio.Queue[dict[str, Any] | None], inbox: asyncio.Queue[dict[str, Any] | None]):
        self._outbox = outbox
        self._inbox = inbox
        self._shut = False

    async def send(self, message: dict[str, Any]) -> None:
        if self._shut:
            raise ConnectionError("Transport closed")
        self._outbox.put_nowait(copy.deepcopy(message))

    async def receive(self) -> dict[str, Any] | None:
        return await self._inbox.get()

    async def close(self) -> None:
        if not self._shut:
            self._shut = True
            self._outbox.put_nowait(None)


def memory_transport_pair() -> tuple[Transport, Transport]:
    """Two linked in-memory transports: what one end sends, the other receives; closing an end ends the other's."""
    one: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    other: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    return _MemoryEnd(one, other), _MemoryEnd(other, one)


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
Script = AnswerSpec | Sequence[AnswerSpec] | Callable[["Elicitation"], AnswerSpec | Awaitable[AnswerSpec]]


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


class ScriptedClient:
    """An ACP client for tests: scripted answers, a full wire transcript, and the client-side checks."""

    def __init__(
        self,
        answers: Script = "accept",
        *,
        capabilities: Mapping[str, Any] | _Omitted | None = URL_ONLY,
        capabilities_field: str = "clientCapabilities",
        protocol_version: int = PROTOCOL_VERSION,
        client_info: Mapping[str, Any] | None = None,
    ) -> None:
        """`capabilities` is sent verbatim as `clientCapabilities` (ACP v1) or, with
        `capabilities_field="capabilities"`, in the v2 field; `None` sends null, `OMITTED` leaves it out."""
        if capabilities_field not in ("clientCapabilities", "capabilities"):
            raise ValueError("capabilities_field is 'clientCapabilities' or 'capabilities'")
        self.answers = answers
        self.capabilities = copy.deepcopy(capabilities)
        self.capabilities_field = capabilities_field
        self.protocol_version = protocol_version
        self.client_info = dict(client_info or {"name": "scripted-acp-client", "version": "0"})
        self.transcript: list[WireMessage] = []
        self.elicitations: list[Elicitation] = []
        self.violations: list[Violation] = []
        self.ignored: list[IgnoredMessage] = []
        self.completions: list[str] = []
        self.updates: list[tuple[str, Any]] = []
        self.state_updates: list[StateUpdate] = []
        self.permission_requests: list[tuple[str, Any]] = []
        self.sessions: set[str] = set()
        self.initialize_response: InitializeResponse | None = None
        self._answered_count = 0
        self._session_requests: set[Any] = set()
        self._arrived: asyncio.Queue[Elicitation] = asyncio.Queue()
        self._consented: asyncio.Queue[Elicitation] = asyncio.Queue()
        self._completed: asyncio.Queue[str] = asyncio.Queue()
        self._wire: Transport | None = None

    # -- what the client advertised ------------------------------------------------------------------------
    def advertises(self, mode: str) -> bool:
        """Whether the client advertised `mode`: `elicitation` and the mode are present and non-null."""
        caps = self.capabilities
        if not isinstance(caps, Mapping):
            return False
        elicitation = caps.get("elicitation")
        return isinstance(elicitation, Mapping) and elicitation.get(mode) is not None

    # -- wiring --------------------------------------------------------------------------------------------
    def transport(self, inner: Transport) -> Transport:
        """Wrap a message transport: record both directions, serve `$/cancel_request`, set the capabilities."""
        self._wire = _ScriptedTransport(inner, self)
        return self._wire

    async def cancel_request(self, request_id: Any) -> None:
        """Send `$/cancel_request` for one of this client's requests (e.g. `sent("session/prompt")[-1]["id"]`)."""
        if self._wire is None:
            raise RuntimeError("ScriptedClient is not connected")
        await self._wire.send({"jsonrpc": "2.0", "method": CANCEL_REQUEST, "params": {"requestId": request_id}})

    def connect(self, transport: Transport) -> ClientSideConnection:
        """A `ClientSideConnection` (unstable protocol on) over `transport`, wrapped by `self.transport()`."""
        return ClientSideConnection(self, self.transport(transport), use_unstable_protocol=True)

    def connect_streams(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> ClientSideConnection:
        """`connect()` over newline-delimited JSON on byte streams (an agent's stdout and stdin, a socket)."""
        return self.connect(_StdioTransport(reader, writer, self))

    async def initialize(self, conn: ClientSideConnection) -> InitializeResponse:
        """Send `initialize` with this client's protocol version and its capabilities exactly as configured."""
        self.initialize_response = await conn.initialize(
            protocol_version=self.protocol_version, client_info=Implementation(**self.client_info)
        )
        return self.initialize_response

    # -- waiting, for tests --------------------------------------------------------------------------------
    async def next_elicitation(self, within: float = 10.0) -> Elicitation:
        """The next elicitation as soon as the client starts handling it (before it answers)."""
        return await asyncio.wait_for(self._arrived.get(), within)

    async def next_consented(self, within: float = 10.0) -> Elicitation:
        """The next elicitation the client decided to accept: its `url` may now be opened."""
        return await asyncio.wait_for(self._consented.get(), within)

    async def next_consented_url(self, within: float = 10.0) -> str:
        return (await self.next_consented(within)).url

    async def next_completion(self, within: float = 10.0) -> str:
        """The elicitationId of the next valid `elicitation/complete`."""
        return await asyncio.wait_for(self._completed.get(), within)

    # -- the transcript ------------------------------------------------------------------------------------
    def received(self, method: str) -> list[dict[str, Any]]:
        """Messages from the agent with this method."""
        return [w.message for w in self.transcript if w.direction == "in" and w.message.get("method") == method]

    def sent(self, method: str) -> list[dict[str, Any]]:
        """Messages to the agent with this method."""
        return [w.message for w in self.transcript if w.direction == "out" and w.message.get("method") == method]

    def responses_to(self, request_id: Any, direction: str = "out") -> list[dict[str, Any]]:
        """Responses (no method) with this JSON-RPC id; by default the ones the client sent."""
        return [
            w.message
            for w in self.transcript
            if w.direction == direction and "method" not in w.message and w.message.get("id") == request_id
        ]

    def wire_text(self) -> str:
        """The whole transcript as text, for scanning it for secrets."""
        return "\n".join(json.dumps(w.message, sort_keys=True, default=str) for w in self.transcript)

    def agent_text(self, session_id: str | None = None) -> str:
        """Every text the agent sent in `session/update`s (messages, tool call content), as JSON text."""
        parts = [
            json.dumps(update.model_dump(mode="json", by_alias=True) if hasattr(update, "model_dump") else update)
            for sid, update in self.updates
            if session_id is None or sid == session_id
        ]
        return "\n".join(parts)

    # -- the SDK's Client interface ------------------------------------------------------------------------
    async def create_elicitation(self, message: str, mode: ElicitationMode, **kwargs: Any) -> CreateElicitationResponse:
        record = self._claim(getattr(mode, "elicitation_id", None))
        self._answered_count += 1
        self._arrived.put_nowait(record)
        if not record.advertised:
            record.answer = Answer.error(INVALID_PARAMS, "Invalid params")
            raise RequestError.invalid_params({"reason": f"elicitation mode {record.mode!r} was not advertised"})
        if record.cancel_requested:
            raise RequestError(REQUEST_CANCELLED, "Request cancelled")
        decide = asyncio.ensure_future(self._decide(record, self._answered_count - 1))
        cancelled = asyncio.ensure_future(record._cancel.wait())
        try:
            await asyncio.wait({decide, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not decide.done():
                decide.cancel()
            cancelled.cancel()
        if not decide.done() or decide.cancelled():
            raise RequestError(REQUEST_CANCELLED, "Request cancelled")
        answer = decide.result()
        record.answer = answer
        if answer.reply is Reply.ACCEPT:
            if isinstance(mode, ElicitationFormSessionMode | ElicitationFormRequestMode):
                return AcceptElicitationResponse(action="accept", content=answer.content)
            record._consented = True
            self._consented.put_nowait(record)
            return AcceptElicitationResponse(action="accept")
        if answer.reply is Reply.DECLINE:
            return DeclineElicitationResponse(action="decline")
        if answer.reply is Reply.CANCEL:
            meta = {"message": answer.message} if answer.message is not None else None
            return CancelElicitationResponse(action="cancel", field_meta=meta)
        if answer.reply is Reply.RAW:
            return DeclineElicitationResponse(action="decline")  # replaced on its way out (`_on_outgoing`)
        raise RequestError(answer.error_code, answer.error_message)

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        known = [e for e in self.elicitations if e.mode == "url" and e.elicitation_id == elicitation_id]
        if not known:
            self.ignored.append(IgnoredMessage("elicitation/complete", elicitation_id, "unknown"))
            return
        if all(e.completed for e in known):
            self.ignored.append(IgnoredMessage("elicitation/complete", elicitation_id, "already_completed"))
            return
        next(e for e in known if not e.completed).completed = True
        self.completions.append(elicitation_id)
        self._completed.put_nowait(elicitation_id)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permission_requests.append((session_id, tool_call))
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse | None:
        raise RequestError.method_not_found("fs/write_text_file")

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> ReadTextFileResponse:
        raise RequestError.method_not_found("fs/read_text_file")

    async def create_terminal(
        self,
        session_id: str,
        command: str,
        args: list[str] | None = None,
        env: list[Any] | None = None,
        cwd: str | None = None,
        output_byte_limit: int | None = None,
        **kwargs: Any,
    ) -> CreateTerminalResponse:
        raise RequestError.method_not_found("terminal/create")

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> TerminalOutputResponse:
        raise RequestError.method_not_found("terminal/output")

    async def release_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> ReleaseTerminalResponse | None:
        raise RequestError.method_not_found("terminal/release")

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> WaitForTerminalExitResponse:
        raise RequestError.method_not_found("terminal/wait_for_exit")

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> KillTerminalResponse | None:
        raise RequestError.method_not_found("terminal/kill")

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None

    def on_connect(self, conn: Any) -> None:
        return None

    # -- internals -----------------------------------------------------------------------------------------
    def _claim(self, elicitation_id: str | None) -> Elicitation:
        """The record the transport made for this request: the first unclaimed one with the same elicitationId."""
        for record in self.elicitations:
            if not record.claimed and record.elicitation_id == elicitation_id:
                record.claimed = True
                return record
        raise RuntimeError("ScriptedClient must be connected through ScriptedClient.transport() / connect()")

    async def _decide(self, record: Elicitation, index: int) -> Answer:
        script = self.answers
        if callable(script):
            produced = script(record)
            spec = await produced if isinstance(produced, Awaitable) else produced
        elif isinstance(script, Sequence) and not isinstance(script, str):
            if not script:
                raise ValueError("an empty answer script")
            spec = script[min(index, len(script) - 1)]
        else:
            spec = script
        answer = Answer.of(spec)
        if answer.reply is not Reply.HOLD:
            return answer
        if record._release is None:
            record._release = asyncio.get_running_loop().create_future()
        return await record._release

    def _violation(self, rule: str, detail: str, request_id: Any = None) -> None:
        self.violations.append(Violation(rule, detail, request_id))

    def _on_outgoing(self, message: dict[str, Any]) -> dict[str, Any]:
        method = message.get("method")
        if method == "initialize":
            params = dict(message.get("params") or {})
            params.pop("clientCapabilities", None)
            params.pop("capabilities", None)
            if not isinstance(self.capabilities, _Omitted):
                params[self.capabilities_field] = copy.deepcopy(self.capabilities)
            params["protocolVersion"] = self.protocol_version
            message = {**message, "params": params}
        elif method in ("session/new", "session/load", "session/resume", "session/fork"):
            self._session_requests.add(message.get("id"))
            request = message.get("params")
            if method == "session/load" and isinstance(request, dict) and isinstance(request.get("sessionId"), str):
                self.sessions.add(request["sessionId"])
        elif method is None and "id" in message:
            for record in self.elicitations:
                if record.request_id == message["id"] and record.response is None:
                    if record.answer is not None and record.answer.raw_message is not None:
                        message = record.answer.raw_message(record.request_id)
                    record.response = message
                    record.answered.set()
                    break
        self.transcript.append(WireMessage("out", copy.deepcopy(message)))
        return message

    def _on_incoming(self, message: dict[str, Any]) -> bool:
        """Record a message from the agent; True when the client consumed it (the SDK must not see it)."""
        self.transcript.append(WireMessage("in", copy.deepcopy(message)))
        method = message.get("method")
        params = message.get("params")
        if method is None:
            if message.get("id") in self._session_requests and isinstance(message.get("result"), dict):
                self._session_requests.discard(message.get("id"))
                session_id = message["result"].get("sessionId")
                if isinstance(session_id, str):
                    self.sessions.add(session_id)
            return False
        if method == "elicitation/create" and "id" in message and isinstance(params, dict):
            self._received_elicitation(message["id"], params)
            return False
        if method == CANCEL_REQUEST and "id" not in message:
            self._received_cancel(params)
            return True
        if (
            method == "session/update"
            and isinstance(params, dict)
            and isinstance(params.get("update"), dict)
            and params["update"].get("sessionUpdate") == "state_update"
        ):
            update = params["update"]
            state = update.get("state")
            self.state_updates.append(
                StateUpdate(str(params.get("sessionId")), state if isinstance(state, str) else None, update)
            )
            return True
        return False

    def _received_elicitation(self, request_id: Any, params: dict[str, Any]) -> None:
        mode = params.get("mode")
        record = Elicitation(
            request_id=request_id,
            raw_params=copy.deepcopy(params),
            advertised=isinstance(mode, str) and self.advertises(mode),
        )
        if not record.advertised:
            record.flags.append("mode_not_advertised")
            self._violation("mode_not_advertised", f"the agent requested mode {mode!r}", request_id)
        session_id = params.get("sessionId")
        if isinstance(session_id, str) and session_id not in self.sessions:
            record.flags.append("unknown_session")
            self._violation("unknown_session", "sessionId names no session of this connection", request_id)
        if mode == "url":
            self._check_url(record, params.get("url"))
            elicitation_id = record.elicitation_id
            if elicitation_id is not None and any(
                e.mode == "url" and e.elicitation_id == elicitation_id and e.outstanding for e in self.elicitations
            ):
                record.flags.append("duplicate_elicitation_id")
                self._violation(
                    "duplicate_elicitation_id", "elicitationId reused while another is outstanding", request_id
                )
        self.elicitations.append(record)

    def _check_url(self, record: Elicitation, url: Any) -> None:
        if not isinstance(url, str):
            record.flags.append("no_url")
            self._violation("no_url", "a URL-mode request without a url", record.request_id)
            return
        try:
            parts = urlsplit(url)
            host = parts.hostname or ""
        except ValueError:
            record.flags.append("invalid_url")
            self._violation("invalid_url", "the url does not parse", record.request_id)
            return
        if parts.scheme not in ("http", "https") or not host:
            record.flags.append("invalid_url")
            self._violation("invalid_url", "the url is not an absolute http(s) URL", record.request_id)
            return
        if parts.username is not None or parts.password is not None:
            record.flags.append("credentials_in_url")
            self._violation("credentials_in_url", "the url carries user credentials", record.request_id)
        if parts.scheme != "https" and not is_loopback_host(host):
            record.flags.append("not_https")
        record.host = assess_host(host)
        if record.host.punycode:
            record.flags.append("punycode_host")
        if record.host.mixed_script:
            record.flags.append("mixed_script_host")

    def _received_cancel(self, params: Any) -> None:
        request_id = params.get("requestId") if isinstance(params, Mapping) else None
        for record in reversed(self.elicitations):  # ids may be reused once answered: the latest one counts
            if record.request_id == request_id:
                if record.response is not None or record.cancel_requested:
                    self.ignored.append(IgnoredMessage(CANCEL_REQUEST, request_id, "already_answered"))
                    return
                record.cancel_requested = True
                record._cancel.set()
                return
        self.ignored.append(IgnoredMessage(CANCEL_REQUEST, request_id, "unknown"))


class _ScriptedTransport:
    """A message transport that lets the scripted client see (and sometimes consume) everything first."""

    def __init__(self, inner: Transport, client: ScriptedClient) -> None:
        self._inner = inner
        self._client = client

    async def send(self, message: dict[str, Any]) -> None:
        await self._inner.send(self._client._on_outgoing(message))

    async def receive(self) -> dict[str, Any] | None:
        while True:
            message = await self._inner.receive()
            if message is None:
                return None
            if not self._client._on_incoming(message):
                return message

    async def close(self) -> None:
        await self._inner.close()


class _StdioTransport:
    """Newline-delimited JSON over a subprocess's pipes; a non-JSON line on stdout is a violation."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: ScriptedClient) -> None:
        self._reader = reader
        self._writer = writer
        self._client = client
        self._lock = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n"
        async with self._lock:
            self._writer.write(data.encode("utf-8"))
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        while True:
            try:
                line = await self._reader.readline()
            except (ConnectionError, ValueError):
                return None
            if not line:
                return None
            text = line.strip()
            if not text:
                continue
            try:
                message = json.loads(text)
            except ValueError:
                self._client._violation("stdout_not_json", "the agent wrote a line that is not JSON to stdout")
                continue
            if isinstance(message, dict):
                return message
            self._client._violation("stdout_not_json", "the agent wrote a JSON value that is not an object")

    async def close(self) -> None:
        return None


@dataclass
class SpawnedAgent:
    """An agent subprocess driven by a `ScriptedClient` over stdio."""

    conn: ClientSideConnection
    process: asyncio.subprocess.Process
    _stderr: bytearray = field(default_factory=bytearray, repr=False)

    def stderr(self) -> str:
        """What the agent wrote to stderr so far."""
        return self._stderr.decode("utf-8", errors="replace")


@asynccontextmanager
async def spawn_agent(
    client: ScriptedClient,
    command: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    shutdown_timeout: float = 10.0,
    on_stderr: Callable[[str], None] | None = None,
) -> AsyncIterator[SpawnedAgent]:
    """Start an ACP agent subprocess (the SDK's `spawn_stdio_transport`) and connect `client` to its stdio.

    `env` is added to the SDK's trimmed default environment. Stderr is collected (`SpawnedAgent.stderr()`) and,
    with `on_stderr`, handed over line by line as it arrives (to show the agent's log while it runs).
    On exit the connection closes, stdin is closed and the process is given `shutdown_timeout` seconds to exit
    before it is terminated (a terminated agent has a negative `process.returncode`).
    """
    async with spawn_stdio_transport(
        command, *args, env=env, cwd=cwd, limit=STDIO_LIMIT, shutdown_timeout=shutdown_timeout
    ) as (reader, writer, proc):
        spawned_stderr = bytearray()

        async def drain_stderr() -> None:
            if proc.stderr is None:
                return
            pending = b""
            while chunk := await proc.stderr.read(65536):
                spawned_stderr.extend(chunk)
                if on_stderr is not None:
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        on_stderr(line.decode("utf-8", errors="replace"))
            if on_stderr is not None and pending:
                on_stderr(pending.decode("utf-8", errors="replace"))

        stderr_task = asyncio.create_task(drain_stderr())
        conn = client.connect_streams(reader, writer)
        try:
            yield SpawnedAgent(conn, proc, spawned_stderr)
        finally:
            await conn.close()
    # The SDK closed stdin and waited for the process (terminating it if needed): stderr is at its end.
    with suppress(TimeoutError):
        await asyncio.wait_for(stderr_task, 5)


__all__ = [
    "FORM_AND_URL",
    "FORM_ONLY",
    "NO_ELICITATION",
    "OMITTED",
    "URL_ONLY",
    "Answer",
    "ConsentRequired",
    "Elicitation",
    "IgnoredMessage",
    "Reply",
    "ScriptedClient",
    "SpawnedAgent",
    "StateUpdate",
    "Violation",
    "WireMessage",
    "memory_transport_pair",
    "spawn_agent",
]
