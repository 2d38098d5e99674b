"""`ScriptedClient`: the SDK's `Client` interface, answering each `elicitation/create` as scripted, with ways for a
test to wait for what happens and to read the transcript."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

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

from .answers import Answer, AnswerSpec, Reply
from .records import Elicitation, IgnoredMessage
from .transports import Transport, _ScriptedTransport, _StdioTransport
from .wire import CANCEL_REQUEST, INVALID_PARAMS, REQUEST_CANCELLED, URL_ONLY, WireObserver, _Omitted

__all__ = ["Script", "ScriptedClient"]

Script = AnswerSpec | Sequence[AnswerSpec] | Callable[["Elicitation"], AnswerSpec | Awaitable[AnswerSpec]]


class ScriptedClient(WireObserver):
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
        super().__init__(copy.deepcopy(capabilities), capabilities_field, protocol_version)
        self.answers = answers
        self.client_info = dict(client_info or {"name": "scripted-acp-client", "version": "0"})
        self.completions: list[str] = []
        self.updates: list[tuple[str, Any]] = []
        self.permission_requests: list[tuple[str, Any]] = []
        self.initialize_response: InitializeResponse | None = None
        self._answered_count = 0
        self._arrived: asyncio.Queue[Elicitation] = asyncio.Queue()
        self._consented: asyncio.Queue[Elicitation] = asyncio.Queue()
        self._completed: asyncio.Queue[str] = asyncio.Queue()
        self._wire: Transport | None = None

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
